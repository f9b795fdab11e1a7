"""The durable floor: the least any client/server pair must do for the driver's durability promise,
with no driver logic (issue 10, "performance goals restated").

Client (`FloorClient`, in the benchmark's process): events are encoded as the same envelopes; each
batch (up to BATCH events, the driver's batch size) is appended to a SQLite journal in WAL mode with
`synchronous=FULL` and committed (one fsync) before it is sent over one `websockets` connection; the
receipted events are deleted from the journal in the next commit, as the driver's journal does. The
journal writes run in a worker thread, as the driver's do. Pipelining is the driver's: it does not cap
the number of unreceipted batches in flight (only the outbox's event bound), so neither does the floor.

Server (`python -m agent_lab.bench._servers floor DB`): for each `events` frame, stores every event
(`event_id`, body) in SQLite WAL with `synchronous=FULL` in one transaction (one fsync), then answers
the receipt listing them; no validation, no dedup rules, no commands.

Every client run has event ids of its own (`drv-floor.<journal file name>/1/<seq>`), as every driver
run in the benchmark has its own instance id: the server runs `INSERT OR IGNORE` into one database for
the whole benchmark, and a run that reused an earlier run's ids would change no row, so its COMMIT
would write nothing and skip the fsync. Until this was found, every floor run after the first reused
`drv-floor/1/...`: the server's "commit" took ~0.03 ms instead of ~0.25 ms, and the floor skipped the
store's fsync that the driver's figures pay (measured in the latency runs, issue 10).
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import anyio
import anyio.lowlevel
import msgspec

BATCH = 256


class FloorClient:
    def __init__(self, journal: Path, port: int) -> None:
        self.url = f"ws://127.0.0.1:{port}/"
        # Ids no earlier run used (see the module's docstring): the store must really write each event.
        self.instance = f"drv-floor.{journal.stem}"
        self.db = sqlite3.connect(journal, check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute("CREATE TABLE IF NOT EXISTS journal (seq INTEGER PRIMARY KEY, body BLOB NOT NULL)")
        self.pending: list[tuple[int, bytes]] = []
        self.to_delete: list[int] = []
        self.emitted: dict[int, float] = {}
        self.receipted: dict[int, float] = {}
        self.more = anyio.Event()
        self.enc = msgspec.json.Encoder()
        self.seq = 0

    def encode(self, payload: dict[str, object]) -> None:
        """Admit one event: an envelope like the driver's, queued for the next journal commit."""
        self.seq += 1
        body = self.enc.encode(
            {
                "event_id": f"{self.instance}/1/{self.seq:06d}",
                "seq": self.seq,
                "epoch": 1,
                "kind": "plan.updated",
                "delivery": "lossless",
                "session_id": "ses-floor",
                "run_id": None,
                "occurred_at": "2026-01-01T00:00:00.000Z",
                "payload": payload,
            }
        )
        self.emitted[self.seq] = time.perf_counter()
        self.pending.append((self.seq, body))
        self.more.set()

    def _commit(self, batch: list[tuple[int, bytes]], delete: list[int]) -> None:
        self.db.execute("BEGIN")
        self.db.executemany("INSERT INTO journal (seq, body) VALUES (?, ?)", batch)
        if delete:
            self.db.executemany("DELETE FROM journal WHERE seq = ?", [(s,) for s in delete])
        self.db.execute("COMMIT")

    async def run(self, produce: object) -> None:
        """Connect, run `produce(self)` (an async callable admitting events), return once every
        admitted event has its receipt."""
        from websockets.asyncio.client import connect

        async with connect(
            self.url,
            subprotocols=["agent-driver.v1"],  # type: ignore[list-item]
            max_size=4 * 1024 * 1024,
            compression=None,
            ping_interval=None,
        ) as ws:
            done = anyio.Event()
            finished = [False]

            async def reader() -> None:
                async for raw in ws:
                    now = time.perf_counter()
                    for event_id in json.loads(raw)["accepted"]:
                        seq = int(event_id.rsplit("/", 1)[1])
                        self.receipted[seq] = now
                        self.to_delete.append(seq)
                    if finished[0] and len(self.receipted) >= self.seq:
                        done.set()
                        return

            async def sender() -> None:
                batch_no = 0
                while True:
                    if not self.pending:
                        self.more = anyio.Event()
                        await self.more.wait()
                    batch, self.pending = self.pending[:BATCH], self.pending[BATCH:]
                    delete, self.to_delete = self.to_delete, []
                    await anyio.to_thread.run_sync(self._commit, batch, delete)
                    batch_no += 1
                    frame = b'{"type":"events","batch":%d,"events":[%b]}' % (batch_no, b",".join(b for _, b in batch))
                    await ws.send(frame.decode())

            async with anyio.create_task_group() as tg:
                tg.start_soon(reader)
                tg.start_soon(sender)
                await produce(self)  # type: ignore[operator]
                finished[0] = True
                if len(self.receipted) < self.seq:
                    with anyio.fail_after(300):
                        await done.wait()
                tg.cancel_scope.cancel()
        self.db.close()

    def latencies_ms(self) -> list[float]:
        return [(self.receipted[s] - t) * 1000 for s, t in self.emitted.items() if s in self.receipted]
