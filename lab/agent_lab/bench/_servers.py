"""Servers the benchmarks run in a child process, so they get a core of their own as in production.

    python -m agent_lab.bench._servers cp DB_PATH      the reference control plane (SQLite store, fsync on)
    python -m agent_lab.bench._servers bare            a bare `websockets` server that only answers receipts
    python -m agent_lab.bench._servers floor DB_PATH   the durable floor's server (bench/durable_floor.py): one
                                             SQLite WAL commit (fsync) per batch, then its receipt
                                             (it answers a driver's hello too: a diagnostic run)

Each prints its port on one stdout line, then serves until its stdin closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys

import msgspec

from agent_lab.bench._common import ROOT, TOKEN

EVENTS_PREFIX = '{"type":"events"'  # how both the driver and the ceiling client start a batch
# What the bare and floor servers answer a driver's hello with (the reference CP's limits).
WELCOME = {
    "type": "welcome",
    "connection_id": "con-bench",
    "heartbeat_interval_ms": 5000,
    "max_batch_events": 256,
    "max_batch_bytes": 1_048_576,
    "accepted_capabilities": [],
}


class _Ev(msgspec.Struct):
    event_id: str


class _Batch(msgspec.Struct):
    batch: int
    events: list[_Ev]


class _RawBatch(msgspec.Struct):
    batch: int
    events: list[msgspec.Raw]


async def _until_stdin_closes() -> None:
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


async def serve_cp(db: str) -> None:
    from agent_lab.controlplane.server import ControlPlane

    async with ControlPlane(db, tokens={TOKEN: None}, http_port=None, heartbeat_interval_ms=5000) as cp:
        print(cp.port, flush=True)
        await _until_stdin_closes()


async def serve_floor(db_path: str) -> None:
    """Store each batch in one fsync'd SQLite WAL transaction, then answer its receipt (in order)."""
    import sqlite3

    from websockets.asyncio.server import ServerConnection, serve
    from websockets.exceptions import ConnectionClosed

    db = sqlite3.connect(db_path, check_same_thread=False, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE IF NOT EXISTS events (event_id TEXT PRIMARY KEY, body BLOB NOT NULL)")
    decoder = msgspec.json.Decoder(_RawBatch)
    encoder = msgspec.json.Encoder()
    id_decoder = msgspec.json.Decoder(_Ev)

    def store(rows: list[tuple[str, bytes]]) -> None:
        db.execute("BEGIN")
        db.executemany("INSERT OR IGNORE INTO events (event_id, body) VALUES (?, ?)", rows)
        db.execute("COMMIT")

    async def handle(ws: ServerConnection) -> None:
        queue: asyncio.Queue[_RawBatch] = asyncio.Queue()

        async def writer() -> None:
            while True:
                frame = await queue.get()
                rows = [(id_decoder.decode(bytes(e)).event_id, bytes(e)) for e in frame.events]
                await asyncio.to_thread(store, rows)
                receipt = {"type": "receipt", "batch": frame.batch, "accepted": [r[0] for r in rows]}
                await ws.send(encoder.encode(receipt).decode())

        task = asyncio.ensure_future(writer())
        try:
            with contextlib.suppress(ConnectionClosed):
                async for message in ws:
                    raw = message if isinstance(message, bytes) else message.encode()
                    if not raw.startswith(EVENTS_PREFIX.encode()):
                        # Only a driver sends these (a diagnostic run of the driver against this
                        # store): answer its hello so its link opens; ignore heartbeats.
                        if json.loads(raw).get("type") == "hello":
                            await ws.send(json.dumps(WELCOME))
                        continue
                    queue.put_nowait(decoder.decode(raw))
        finally:
            task.cancel()

    async with serve(
        handle,
        "127.0.0.1",
        0,
        subprotocols=["agent-driver.v1"],  # type: ignore[list-item]
        max_size=4 * 1024 * 1024,
        compression=None,
        ping_interval=None,
    ) as srv:
        print(srv.sockets[0].getsockname()[1], flush=True)
        await _until_stdin_closes()
    db.close()


async def serve_bare() -> None:
    from websockets.asyncio.server import ServerConnection, serve
    from websockets.exceptions import ConnectionClosed

    decoder = msgspec.json.Decoder(_Batch)
    encoder = msgspec.json.Encoder()

    async def handle(ws: ServerConnection) -> None:
        with contextlib.suppress(ConnectionClosed):  # a benchmark client leaves without a close frame
            await _answer(ws)

    async def _answer(ws: ServerConnection) -> None:
        async for message in ws:
            raw = message if isinstance(message, str) else message.decode()
            if not raw.startswith(EVENTS_PREFIX):
                # Only a driver sends these: answer its hello so its link opens; ignore the rest.
                if json.loads(raw).get("type") == "hello":
                    await ws.send(json.dumps(WELCOME))
                continue
            frame = decoder.decode(raw)
            receipt = {"type": "receipt", "batch": frame.batch, "accepted": [e.event_id for e in frame.events]}
            await ws.send(encoder.encode(receipt).decode())

    async with serve(
        handle,
        "127.0.0.1",
        0,
        subprotocols=["agent-driver.v1"],  # type: ignore[list-item]
        max_size=4 * 1024 * 1024,
        compression=None,
        ping_interval=None,
    ) as srv:
        print(srv.sockets[0].getsockname()[1], flush=True)
        await _until_stdin_closes()


class Child:
    """One server child: `.port`, and `close()` (closes its stdin and waits)."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agent_lab.bench._servers", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=ROOT,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.strip():
            self.close()
            raise RuntimeError(f"server child {args} did not start")
        self.port = int(line)

    def close(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def main(argv: list[str]) -> None:
    from driver import logs

    logs.configure("error")  # logs go to stderr; stdout carries only the port line
    if argv[:1] == ["cp"]:
        asyncio.run(serve_cp(argv[1]))
    elif argv[:1] == ["floor"]:
        asyncio.run(serve_floor(argv[1]))
    elif argv[:1] == ["bare"]:
        asyncio.run(serve_bare())
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
