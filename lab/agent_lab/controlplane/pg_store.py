"""The PostgreSQL engine (asyncpg): what lets N gateway processes share one database.

- Ownership: an instance's row carries its highest epoch and a link generation. A claim is one conditional
  statement (`pg_schema.CLAIM`); claims that queue up while one is on its way are sent as one group,
  sorted by instance id. Every event batch is stored only while its link generation holds: the row is
  read `FOR SHARE` in the batch's transaction, so a takeover (an UPDATE of that row) waits for a batch
  in flight and a batch behind a committed takeover sees the new generation and stores nothing. No
  advisory lock per link: 10,000 links would overflow the lock table.
- Events: one writer per instance (its batches that queue up while one is being stored are coalesced into
  one transaction), `INSERT ... ON CONFLICT DO NOTHING` on the unique (instance, event_id); the futures
  resolve after COMMIT with `synchronous_commit = on`.
- Commands are stored with a `NOTIFY` in the same transaction; so are takeovers (one per claim group) and
  terminations. There is no NOTIFY per event batch: NOTIFY serialises commits.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import asyncpg

from agent_lab.controlplane import pg_events
from agent_lab.controlplane.engine import Notice, Reads
from agent_lab.controlplane.pg_schema import CLAIM, SCHEMA, SCHEMA_LOCK_KEY
from agent_lab.controlplane.store_rows import (
    PENDING,
    BatchResult,
    CommandExists,
    EpochVerdict,
    StoredRejection,
    now_iso,
)
from agent_lab.controlplane.validation import ValidEvent
from driver import logs
from driver.protocol.frames import TERMINAL_STATUSES

log = logs.get("agent_driver.controlplane")

CHANNELS = ("cp_command", "cp_takeover", "cp_terminated")
NOTIFY_IDS = 100  # instance ids per takeover NOTIFY (a payload is at most 8,000 bytes)
_TERMINAL = sorted(TERMINAL_STATUSES)
_Item = tuple[int, Sequence[ValidEvent], Sequence[StoredRejection], "asyncio.Future[BatchResult]"]


class PgEngine:
    name = "postgresql"

    def __init__(self, url: str, gateway_id: str, *, pool_size: int = 10) -> None:
        self.url = url
        self.gateway_id = gateway_id
        self.notices: Callable[[Notice], None] | None = None
        self._pool_size = pool_size
        self._pool: asyncpg.Pool | None = None
        self._listener: asyncpg.Connection | None = None
        self._claims: list[tuple[str, int, asyncio.Future[EpochVerdict]]] = []
        self._claiming = False
        self._writers: dict[str, list[_Item]] = {}  # instance -> batches waiting for its writer
        self._tasks: set[asyncio.Task[None]] = set()
        self.commits = 0  # event transactions committed, for tests and benches
        self.claim_groups = 0

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        settings = {"synchronous_commit": "on", "application_name": f"agent-lab {self.gateway_id}"}
        self._pool = await asyncpg.create_pool(self.url, min_size=2, max_size=self._pool_size, server_settings=settings)
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", SCHEMA_LOCK_KEY)
            await conn.execute(SCHEMA)
        self._listener = await asyncpg.connect(self.url, server_settings=settings)
        for channel in CHANNELS:
            await self._listener.add_listener(channel, self._heard)

    async def close(self) -> None:
        while self._tasks:  # queued writes finish (their futures resolve) before the pool goes
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        if self._listener is not None:
            await self._listener.close()
            self._listener = None
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    def open_reads(self) -> Reads:
        from agent_lab.controlplane.pg_reads import PgReads

        return PgReads(self.url)

    @property
    def pool(self) -> asyncpg.Pool:
        if self._pool is None:
            raise RuntimeError("control plane is not running")
        return self._pool

    def _spawn(self, coro: Any) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _heard(self, _conn: object, _pid: int, channel: str, payload: str) -> None:
        if self.notices is None:
            return
        if channel == "cp_command":
            instance_id, command_id = json.loads(payload)
            self.notices(("command", instance_id, command_id))
        elif channel == "cp_takeover":
            for instance_id, generation in json.loads(payload):
                self.notices(("takeover", instance_id, generation))
        elif channel == "cp_terminated":
            self.notices(("terminated", payload, None))

    # -- claims ---------------------------------------------------------------------------------

    async def claim(self, instance_id: str, epoch: int) -> EpochVerdict:
        fut: asyncio.Future[EpochVerdict] = asyncio.get_running_loop().create_future()
        self._claims.append((instance_id, epoch, fut))
        if not self._claiming:
            self._claiming = True
            self._spawn(self._claim_loop())
        return await fut

    async def _claim_loop(self) -> None:
        try:
            while self._claims:
                group: dict[str, tuple[str, int, asyncio.Future[EpochVerdict]]] = {}
                rest = []
                for claim in self._claims:  # one claim per instance per statement; a second waits
                    (rest.append(claim) if claim[0] in group else group.__setitem__(claim[0], claim))
                self._claims = rest
                claims = sorted(group.values(), key=lambda c: c[0])
                try:
                    verdicts = await self.claim_group([(i, e) for i, e, _ in claims])
                except Exception as exc:
                    for _, _, fut in claims:
                        if not fut.done():
                            fut.set_exception(exc)
                    continue
                for (_, _, fut), verdict in zip(claims, verdicts, strict=True):
                    if not fut.done():
                        fut.set_result(verdict)
        finally:
            self._claiming = False

    async def claim_group(self, claims: Sequence[tuple[str, int]]) -> list[EpochVerdict]:
        """Claim every (instance, epoch) in one statement, sorted by instance id; one verdict each."""
        ordered = sorted(claims)
        ids = [i for i, _ in ordered]
        async with self.pool.acquire() as conn, conn.transaction():
            claimed = await conn.fetch(CLAIM, ids, [e for _, e in ordered], self.gateway_id, now_iso())
            won = {r[0]: int(r[1]) for r in claimed}
            lost = [i for i in ids if i not in won]
            rows = {}
            if lost:
                rows = {
                    r[0]: r
                    for r in await conn.fetch(
                        "SELECT instance_id, highest_epoch, terminated_at FROM instances WHERE instance_id = ANY($1)",
                        lost,
                    )
                }
            taken = [[i, won[i]] for i in ids if i in won]
            for at in range(0, len(taken), NOTIFY_IDS):  # delivered at COMMIT, in commit order
                await conn.execute("SELECT pg_notify('cp_takeover', $1)", json.dumps(taken[at : at + NOTIFY_IDS]))
        self.claim_groups += 1
        by_id: dict[str, EpochVerdict] = {}
        for instance_id, epoch in ordered:
            if instance_id in won:
                by_id[instance_id] = EpochVerdict(True, epoch, generation=won[instance_id])
            else:
                row = rows[instance_id]
                by_id[instance_id] = EpochVerdict(
                    False, int(row["highest_epoch"]), terminated=row["terminated_at"] is not None
                )
        return [by_id[i] for i, _ in claims]

    # -- events ---------------------------------------------------------------------------------

    def insert_events(
        self, instance_id: str, generation: int, events: Sequence[ValidEvent], rejected: Sequence[StoredRejection]
    ) -> asyncio.Future[BatchResult]:
        """Queue a batch on the instance's writer; resolves after the COMMIT that stores it."""
        fut: asyncio.Future[BatchResult] = asyncio.get_running_loop().create_future()
        queue = self._writers.get(instance_id)
        item = (generation, events, rejected, fut)
        if queue is not None:
            queue.append(item)
        else:
            self._writers[instance_id] = [item]
            self._spawn(self._write_instance(instance_id))
        return fut

    async def _write_instance(self, instance_id: str) -> None:
        queue = self._writers[instance_id]
        try:
            while queue:
                generation = queue[0][0]
                group = [item for item in queue if item[0] == generation]  # one link generation per group
                queue[:] = [item for item in queue if item[0] != generation]
                try:
                    results: list[BatchResult] | Exception = await pg_events.store_group(
                        self.pool, instance_id, generation, [(ev, rej) for _, ev, rej, _ in group]
                    )
                    self.commits += 1
                except Exception as exc:
                    results = exc
                for at, (_, _, _, fut) in enumerate(group):
                    if fut.done():
                        continue
                    if isinstance(results, Exception):
                        fut.set_exception(results)
                    else:
                        fut.set_result(results[at])
        finally:
            del self._writers[instance_id]

    # -- commands -------------------------------------------------------------------------------

    async def add_command(
        self, instance_id: str, kind: str, fields: dict[str, Any], command_id: str | None
    ) -> dict[str, Any]:
        command_id = command_id or f"cmd-{uuid.uuid4().hex}"
        stamp = now_iso()
        async with self.pool.acquire() as conn:
            try:
                async with conn.transaction():
                    seq = int(
                        await conn.fetchval(
                            "INSERT INTO instances AS i (instance_id, highest_epoch, command_seq, updated_at) "
                            "VALUES ($1, 0, 1, $2) ON CONFLICT (instance_id) DO UPDATE SET "
                            "command_seq = i.command_seq + 1 RETURNING command_seq",
                            instance_id,
                            stamp,
                        )
                    )
                    body = {**fields, "type": "command", "command_id": command_id, "seq": seq, "kind": kind}
                    await conn.execute(
                        "INSERT INTO commands (instance_id, seq, command_id, kind, body, status, result, error, "
                        "created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, NULL, NULL, $7, $7)",
                        instance_id,
                        seq,
                        command_id,
                        kind,
                        json.dumps(body),
                        PENDING,
                        stamp,
                    )
                    await conn.execute("SELECT pg_notify('cp_command', $1)", json.dumps([instance_id, command_id]))
            except asyncpg.UniqueViolationError:
                raise CommandExists(f"command {command_id} already exists") from None
        return {
            "instance_id": instance_id,
            "seq": seq,
            "command_id": command_id,
            "kind": kind,
            "body": body,
            "status": PENDING,
            "result": None,
            "error": None,
            "created_at": stamp,
            "updated_at": stamp,
        }

    async def record_update(
        self,
        instance_id: str,
        command_id: str,
        status: str,
        result: dict[str, Any] | None,
        error: dict[str, Any] | None,
    ) -> bool:
        async with self.pool.acquire() as conn, conn.transaction():
            return await pg_events.apply_update(
                conn,
                instance_id,
                command_id,
                status,
                None if result is None else json.dumps(result),
                None if error is None else json.dumps(error),
                now_iso(),
            )

    async def terminate(self, instance_id: str) -> None:
        stamp = now_iso()
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute(
                "INSERT INTO instances AS i (instance_id, highest_epoch, terminated_at, updated_at) "
                "VALUES ($1, 0, $2, $2) ON CONFLICT (instance_id) DO UPDATE SET "
                "terminated_at = excluded.terminated_at, updated_at = excluded.updated_at",
                instance_id,
                stamp,
            )
            await conn.execute("SELECT pg_notify('cp_terminated', $1)", instance_id)
