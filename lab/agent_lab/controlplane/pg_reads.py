"""`Reads` for the PostgreSQL engine: the same synchronous queries as SQLite's `Store`, answered by one
asyncpg connection on a private thread with its own event loop.

The control plane's readers (tests, the HTTP API, the console) call the store synchronously on the
event loop, as they do with SQLite; a query here blocks that loop for one round trip, as a SQLite read
blocks it for one page read. Each query sees every committed write (READ COMMITTED).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Coroutine, Iterable
from typing import Any, TypeVar

import asyncpg

from agent_lab.controlplane.store_rows import COMMAND_COLUMNS, EVENT_COLUMNS, command_row, event_row, loads_or_none
from driver.protocol.frames import TERMINAL_STATUSES

T = TypeVar("T")
_TERMINAL = sorted(TERMINAL_STATUSES)
_CHECKPOINT_COLUMNS = "instance_id, checkpoint_id, run_id, runtime, native_ref, files, bytes, recorded_at"


class PgReads:
    def __init__(self, url: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="cp-pg-reads", daemon=True)
        self._thread.start()
        self._conn: asyncpg.Connection = self._run(asyncpg.connect(url))

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=60)

    def _fetch(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        return self._run(self._conn.fetch(sql, *args))

    def _value(self, sql: str, *args: Any) -> Any:
        return self._run(self._conn.fetchval(sql, *args))

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._run(self._conn.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()

    def highest_epoch(self, instance_id: str) -> int:
        found = self._value("SELECT highest_epoch FROM instances WHERE instance_id = $1", instance_id)
        return 0 if found is None else int(found)

    def link_generation(self, instance_id: str) -> int:
        found = self._value("SELECT link_generation FROM instances WHERE instance_id = $1", instance_id)
        return 0 if found is None else int(found)

    def events(
        self,
        instance_id: str,
        kinds: Iterable[str] | None = None,
        run_id: str | None = None,
        after_seq: int | None = None,
        limit: int | None = None,
        delivery: str | None = None,
    ) -> list[dict[str, Any]]:
        sql = f"SELECT {EVENT_COLUMNS} FROM events WHERE instance_id = $1"
        args: list[Any] = [instance_id]

        def arg(value: Any) -> str:
            args.append(value)
            return f"${len(args)}"

        if kinds is not None:
            sql += f" AND kind = ANY({arg(list(kinds))}::text[])"
        if run_id is not None:
            sql += f" AND run_id = {arg(run_id)}"
        if after_seq is not None:
            sql += f" AND seq > {arg(after_seq)}"
        if delivery is not None:
            sql += f" AND delivery = {arg(delivery)}"
        sql += " ORDER BY seq, id"
        if limit is not None:
            sql += f" LIMIT {arg(limit)}"
        return [event_row(r) for r in self._fetch(sql, *args)]

    def count_events(self, instance_id: str | None = None) -> int:
        if instance_id is None:
            return int(self._value("SELECT COUNT(*) FROM events"))
        return int(self._value("SELECT COUNT(*) FROM events WHERE instance_id = $1", instance_id))

    def commands(self, instance_id: str) -> list[dict[str, Any]]:
        rows = self._fetch(f"SELECT {COMMAND_COLUMNS} FROM commands WHERE instance_id = $1 ORDER BY seq", instance_id)
        return [command_row(r) for r in rows]

    def command(self, command_id: str) -> dict[str, Any] | None:
        rows = self._fetch(f"SELECT {COMMAND_COLUMNS} FROM commands WHERE command_id = $1", command_id)
        return command_row(rows[0]) if rows else None

    def pending_commands(self, instance_id: str, after_seq: int) -> list[dict[str, Any]]:
        rows = self._fetch(
            f"SELECT {COMMAND_COLUMNS} FROM commands WHERE instance_id = $1 AND seq > $2 "
            "AND status <> ALL($3::text[]) ORDER BY seq",
            instance_id,
            after_seq,
            _TERMINAL,
        )
        return [command_row(r) for r in rows]

    def command_updates(self, command_id: str) -> list[dict[str, Any]]:
        rows = self._fetch(
            "SELECT instance_id, command_id, status, result, error, received_at FROM command_updates "
            "WHERE command_id = $1 ORDER BY id",
            command_id,
        )
        return [
            {
                "instance_id": r["instance_id"],
                "command_id": r["command_id"],
                "status": r["status"],
                "result": loads_or_none(r["result"]),
                "error": loads_or_none(r["error"]),
                "received_at": r["received_at"],
            }
            for r in rows
        ]

    def checkpoints(self, instance_id: str) -> list[dict[str, Any]]:
        rows = self._fetch(
            f"SELECT {_CHECKPOINT_COLUMNS} FROM checkpoints WHERE instance_id = $1 ORDER BY id", instance_id
        )
        return [_checkpoint(r) for r in rows]

    def latest_checkpoint(self, instance_id: str) -> dict[str, Any] | None:
        rows = self._fetch(
            f"SELECT {_CHECKPOINT_COLUMNS} FROM checkpoints WHERE instance_id = $1 ORDER BY id DESC LIMIT 1",
            instance_id,
        )
        return _checkpoint(rows[0]) if rows else None

    def checkpoint_blob(self, sha256: str) -> bytes | None:
        found = self._value("SELECT data FROM checkpoint_blobs WHERE sha256 = $1", sha256)
        return None if found is None else bytes(found)


def _checkpoint(r: asyncpg.Record) -> dict[str, Any]:
    return {
        "instance_id": r["instance_id"],
        "checkpoint_id": r["checkpoint_id"],
        "run_id": r["run_id"],
        "runtime": r["runtime"],
        "native_ref": r["native_ref"],
        "files": json.loads(r["files"]),
        "bytes": r["bytes"],
        "recorded_at": r["recorded_at"],
    }


class PgConsoleQueries(PgReads):
    """The console's own queries (`console.queries.ConsoleQueries`) on the PostgreSQL engine."""

    def events_after(self, instance_id: str, after_row: int, limit: int) -> list[dict[str, Any]]:
        rows = self._fetch(
            "SELECT id, event_id, seq, epoch, kind, delivery, session_id, run_id, occurred_at, payload, stored_at "
            "FROM events WHERE instance_id = $1 AND id > $2 ORDER BY id LIMIT $3",
            instance_id,
            after_row,
            limit,
        )
        return [{"row": r["id"], **event_row(r)} for r in rows]

    def event(self, instance_id: str, event_id: str) -> dict[str, Any] | None:
        rows = self._fetch(
            "SELECT kind, payload FROM events WHERE instance_id = $1 AND event_id = $2", instance_id, event_id
        )
        return None if not rows else {"kind": rows[0]["kind"], "payload": json.loads(rows[0]["payload"])}

    def instances(self) -> list[dict[str, Any]]:
        rows = self._fetch("SELECT instance_id, highest_epoch, terminated_at FROM instances ORDER BY updated_at DESC")
        return [dict(r) for r in rows]

    def latest_payload(self, instance_id: str, kind: str) -> dict[str, Any] | None:
        found = self._value(
            "SELECT payload FROM events WHERE instance_id = $1 AND kind = $2 ORDER BY id DESC LIMIT 1",
            instance_id,
            kind,
        )
        return None if found is None else dict(json.loads(found))

    def count_diagnostics(self, instance_id: str, code: str) -> int:
        return int(
            self._value(
                "SELECT COUNT(*) FROM events WHERE instance_id = $1 AND kind = 'diagnostic.reported' "
                "AND (payload::jsonb) ->> 'code' = $2",
                instance_id,
                code,
            )
        )
