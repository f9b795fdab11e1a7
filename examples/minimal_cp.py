"""A minimal control plane for agent-driver (PROTOCOL.md, version 1), to read in ten minutes.

Standard library + `websockets` + `sqlite3`, one file. What it shows, and where:
- the handshake (`Link.handshake`): bearer token (4401), instance allowed (4403), `hello` first (4400),
  epoch fencing (4409: an older epoch is refused; a newer link supersedes the older one), `welcome`,
  then every stored command without a terminal status is sent again;
- events and receipts (`Store.store_events`): each batch is written in one SQLite transaction, fsync'd
  (`synchronous=FULL`), and only then receipted; `event_id` is the primary key, so a resent event is
  stored once and accepted again;
- commands (`MinimalCP.send_command`): a per-instance `seq`, `command.update` frames and the lossless
  `command.finished` event both set the status; a terminal status is never overwritten;
- liveness (`Link.keepalive`): a ping every interval; 4408 after three silent intervals.

It leaves out what a real control plane needs beyond the contract (users, a console, TLS, several
processes). A tiny HTTP API, the reference control plane's routes, lets a test or
`agent-driver controlplane conformance --api` drive it:
    POST /api/instances/ID/commands {"kind": ..., ...}   GET /api/instances/ID/commands
    GET  /api/instances/ID/events

Run it:  python examples/minimal_cp.py --db cp.sqlite3 --token-file cp.token [--port 8765] [--api-port 8766]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import json
import secrets
import sqlite3
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.typing import Subprotocol

SUBPROTOCOL = Subprotocol("agent-driver.v1")
TERMINAL = ("completed", "failed", "cancelled")
SCHEMA = """
CREATE TABLE IF NOT EXISTS instances (instance_id TEXT PRIMARY KEY, highest_epoch INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS events (
  event_id TEXT PRIMARY KEY, instance_id TEXT NOT NULL, seq INTEGER NOT NULL, epoch INTEGER NOT NULL,
  kind TEXT NOT NULL, run_id TEXT, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS commands (
  command_id TEXT PRIMARY KEY, instance_id TEXT NOT NULL, seq INTEGER NOT NULL, kind TEXT NOT NULL,
  body TEXT NOT NULL, status TEXT NOT NULL, result TEXT, error TEXT, UNIQUE (instance_id, seq));
"""


class Store:
    """The durable state: instances' highest epoch, events by `event_id`, commands and their status."""

    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")  # a commit is on disk before a receipt says so
        self.db.executescript(SCHEMA)
        self.lock = threading.Lock()  # the HTTP thread reads through the same connection

    def _one(self, sql: str, *args: Any) -> Any:
        with self.lock:
            return self.db.execute(sql, args).fetchone()

    def _all(self, sql: str, *args: Any) -> list[Any]:
        with self.lock:
            return self.db.execute(sql, args).fetchall()

    def observe_epoch(self, instance_id: str, epoch: int) -> int | None:
        """Record `epoch`; None when it is allowed, else the higher epoch already seen."""
        with self.lock:
            row = self.db.execute(
                "SELECT highest_epoch FROM instances WHERE instance_id = ?", (instance_id,)
            ).fetchone()
            if row is not None and row[0] > epoch:
                return int(row[0])
            self.db.execute("INSERT OR REPLACE INTO instances VALUES (?, ?)", (instance_id, epoch))
            return None

    def store_events(self, instance_id: str, events: list[Any]) -> tuple[list[str], list[dict[str, Any]]]:
        """(accepted ids, rejections): stored in one transaction, committed before this returns."""
        accepted, rejected, rows = [], [], []
        for e in events:
            event_id = e.get("event_id") if isinstance(e, dict) else None
            fields_ok = isinstance(e, dict) and isinstance(e.get("seq"), int) and isinstance(e.get("kind"), str)
            if not isinstance(event_id, str) or not fields_ok:
                if isinstance(event_id, str):
                    rejected.append({"event_id": event_id, "code": "event.invalid", "message": "seq or kind missing"})
                continue  # without an event_id nothing can be said about it
            rows.append((event_id, instance_id, e["seq"], e.get("epoch", 0), e["kind"], e.get("run_id"), json.dumps(e)))
            accepted.append(event_id)
        with self.lock:
            self.db.execute("BEGIN IMMEDIATE")
            # A duplicate (a resend after a lost receipt or a driver restart) is ignored here and accepted again.
            self.db.executemany("INSERT OR IGNORE INTO events VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
            for e in events:
                if isinstance(e, dict) and e.get("kind") == "command.finished" and isinstance(e.get("payload"), dict):
                    p = e["payload"]
                    self._set_status(p.get("command_id"), p.get("status"), p.get("result"), p.get("error"))
            self.db.execute("COMMIT")
        return accepted, rejected

    def _set_status(self, command_id: Any, status: Any, result: Any, error: Any) -> None:
        # A terminal status is a fact: never replaced, and `accepted` never follows it.
        self.db.execute(
            "UPDATE commands SET status = ?, result = ?, error = ? WHERE command_id = ? AND status NOT IN (?, ?, ?)",
            (status, json.dumps(result), json.dumps(error), command_id, *TERMINAL),
        )

    def set_status(self, update: dict[str, Any]) -> None:
        with self.lock:
            self._set_status(update.get("command_id"), update.get("status"), update.get("result"), update.get("error"))

    def add_command(self, instance_id: str, kind: str, fields: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.db.execute("BEGIN IMMEDIATE")
            (last,) = self.db.execute(
                "SELECT COALESCE(MAX(seq), 0) FROM commands WHERE instance_id = ?", (instance_id,)
            ).fetchone()
            command = {
                "type": "command",
                "command_id": f"cmd-{uuid.uuid4().hex[:16]}",
                "seq": last + 1,
                "kind": kind,
                **fields,
            }
            self.db.execute(
                "INSERT INTO commands VALUES (?, ?, ?, ?, ?, 'queued', NULL, NULL)",
                (command["command_id"], instance_id, command["seq"], kind, json.dumps(command)),
            )
            self.db.execute("COMMIT")
        return command

    def pending_commands(self, instance_id: str, after_seq: int) -> list[dict[str, Any]]:
        rows = self._all(
            "SELECT body FROM commands WHERE instance_id = ? AND seq > ? AND status NOT IN (?, ?, ?) ORDER BY seq",
            instance_id,
            after_seq,
            *TERMINAL,
        )
        return [json.loads(r[0]) for r in rows]

    def commands(self, instance_id: str) -> list[dict[str, Any]]:
        rows = self._all(
            "SELECT command_id, seq, kind, status, result, error FROM commands WHERE instance_id = ? ORDER BY seq",
            instance_id,
        )
        return [
            {
                "command_id": r[0],
                "seq": r[1],
                "kind": r[2],
                "status": r[3],
                "result": json.loads(r[4] or "null"),
                "error": json.loads(r[5] or "null"),
            }
            for r in rows
        ]

    def events(self, instance_id: str) -> list[dict[str, Any]]:
        return [
            json.loads(r[0])
            for r in self._all("SELECT body FROM events WHERE instance_id = ? ORDER BY seq", instance_id)
        ]


class Link:
    """One driver connection, from the handshake to its close."""

    def __init__(self, cp: MinimalCP, ws: ServerConnection) -> None:
        self.cp, self.ws = cp, ws
        self.instance_id = ""
        self.epoch = 0
        self.last_heard = asyncio.get_running_loop().time()

    async def serve(self) -> None:
        if not await self.handshake():
            return
        keepalive = asyncio.ensure_future(self.keepalive())
        try:
            async for message in self.ws:
                self.last_heard = asyncio.get_running_loop().time()
                await self.on_frame(json.loads(message))
        except (ConnectionClosed, ValueError):
            with contextlib.suppress(ConnectionClosed):
                await self.ws.close(4400, "frames must be JSON objects")
        finally:
            keepalive.cancel()
            if self.cp.links.get(self.instance_id) is self:
                del self.cp.links[self.instance_id]

    async def handshake(self) -> bool:
        headers = self.ws.request.headers if self.ws.request else {}
        token = headers.get("Authorization", "")
        if not hmac.compare_digest(token.encode(), f"Bearer {self.cp.token}".encode()):
            await self.ws.close(4401, "bad token")
            return False
        self.instance_id = headers.get("Agent-Driver-Instance", "")
        if self.cp.instances is not None and self.instance_id not in self.cp.instances:
            await self.ws.close(4403, "instance not allowed")
            return False
        try:
            hello = json.loads(await asyncio.wait_for(self.ws.recv(), 10))
        except (TimeoutError, ValueError, ConnectionClosed):
            await self.ws.close(4400, "hello expected")
            return False
        if (
            not isinstance(hello, dict)
            or hello.get("type") != "hello"
            or hello.get("driver_instance_id") != self.instance_id
        ):
            await self.ws.close(4400, "the first frame must be this instance's hello")
            return False
        self.epoch = int(hello.get("epoch", 0))
        higher = self.cp.store.observe_epoch(self.instance_id, self.epoch)
        old = self.cp.links.get(self.instance_id)
        if higher is not None or (old is not None and old.epoch > self.epoch):
            await self.ws.close(4409, f"epoch {self.epoch} is older than {higher or old.epoch}")  # type: ignore[union-attr]
            return False
        self.cp.links[self.instance_id] = self
        if old is not None:
            # In the background: a silent old peer must not delay this welcome by its close timeout.
            task = asyncio.ensure_future(old.ws.close(4409, "superseded by a newer connection"))
            self.cp.background.add(task)
            task.add_done_callback(self.cp.background.discard)
        await self.ws.send(
            json.dumps(
                {
                    "type": "welcome",
                    "connection_id": f"con-{uuid.uuid4().hex[:12]}",
                    "heartbeat_interval_ms": self.cp.heartbeat_ms,
                    "max_batch_events": 256,
                    "max_batch_bytes": 1_048_576,
                    "max_event_bytes": 262_144,
                    "accepted_capabilities": [c["id"] for c in hello.get("capabilities", []) if c.get("supported")],
                }
            )
        )
        for command in self.cp.store.pending_commands(self.instance_id, int(hello.get("last_command_seq", 0))):
            await self.ws.send(json.dumps(command))
        return True

    async def on_frame(self, frame: dict[str, Any]) -> None:
        kind = frame.get("type")
        if kind == "events":
            events = frame["events"] if isinstance(frame.get("events"), list) else []
            # sqlite3 blocks; a worker thread keeps the link (and pings) moving while it commits.
            accepted, rejected = await asyncio.to_thread(self.cp.store.store_events, self.instance_id, events)
            await self.ws.send(
                json.dumps({"type": "receipt", "batch": frame.get("batch"), "accepted": accepted, "rejected": rejected})
            )
        elif kind == "command.update":
            self.cp.store.set_status(frame)
        elif kind == "heartbeat":
            self.cp.heartbeats[self.instance_id] = frame
        else:
            await self.ws.close(4400, f"unknown frame type {kind!r}")
            return
        self.cp.notify()

    async def keepalive(self) -> None:
        interval = self.cp.heartbeat_ms / 1000
        loop = asyncio.get_running_loop()
        with contextlib.suppress(ConnectionClosed):
            while True:
                await asyncio.sleep(interval)
                if loop.time() - self.last_heard > 3 * interval:
                    await self.ws.close(4408, "heartbeat timeout")
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(await self.ws.ping(), interval)
                    self.last_heard = loop.time()  # the pong came


class MinimalCP:
    """`async with MinimalCP(db, token) as cp:` then boot a driver with `control.url = cp.url`."""

    def __init__(
        self,
        db: Path,
        token: str,
        *,
        port: int = 0,
        api_port: int | None = 0,
        instances: set[str] | None = None,
        heartbeat_ms: int = 5000,
    ) -> None:
        self.db, self.token, self.port, self.api_port = db, token, port, api_port
        self.instances, self.heartbeat_ms = instances, heartbeat_ms
        self.links: dict[str, Link] = {}
        self.background: set[asyncio.Future[None]] = set()
        self.heartbeats: dict[str, dict[str, Any]] = {}
        self._changed = asyncio.Event()

    async def __aenter__(self) -> MinimalCP:
        self.store = Store(self.db)
        self.loop = asyncio.get_running_loop()
        self.server = await serve(
            lambda ws: Link(self, ws).serve(), "127.0.0.1", self.port, subprotocols=[SUBPROTOCOL], ping_interval=None
        )
        self.port = self.server.sockets[0].getsockname()[1]
        if self.api_port is not None:
            self.http = ThreadingHTTPServer(("127.0.0.1", self.api_port), _api_handler(self))
            self.api_port = self.http.server_address[1]
            threading.Thread(target=self.http.serve_forever, daemon=True).start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.api_port is not None:
            self.http.shutdown()
            self.http.server_close()
        self.server.close()
        await self.server.wait_closed()
        self.store.db.close()

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/driver"

    def notify(self) -> None:
        self._changed.set()

    async def wait_until(self, condition: Any, timeout: float = 30) -> None:
        """Re-check `condition` after every frame until it holds."""
        async with asyncio.timeout(timeout):
            while not condition():
                self._changed.clear()
                await self._changed.wait()

    async def send_command(self, instance_id: str, kind: str, **fields: Any) -> dict[str, Any]:
        """Store the command first (so a reconnecting driver gets it after its welcome), then send it."""
        command = self.store.add_command(instance_id, kind, fields)
        link = self.links.get(instance_id)
        if link is not None:
            with contextlib.suppress(ConnectionClosed):
                await link.ws.send(json.dumps(command))
        return command


def _api_handler(cp: MinimalCP) -> type[BaseHTTPRequestHandler]:
    class Api(BaseHTTPRequestHandler):
        def _answer(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _route(self) -> tuple[str, str] | None:
            parts = self.path.split("?")[0].strip("/").split("/")
            ok = hmac.compare_digest(self.headers.get("Authorization", "").encode(), f"Bearer {cp.token}".encode())
            if not ok:
                self._answer(401, {"error": "bad token"})
                return None
            if len(parts) != 4 or parts[:2] != ["api", "instances"]:
                self._answer(404, {"error": "not found"})
                return None
            return parts[2], parts[3]

        def do_GET(self) -> None:  # http.server's names
            route = self._route()
            if route is not None and route[1] in ("events", "commands"):
                read = cp.store.events if route[1] == "events" else cp.store.commands
                self._answer(200, {route[1]: read(route[0])})
            elif route is not None:
                self._answer(404, {"error": "not found"})

        def do_POST(self) -> None:
            route = self._route()
            if route is None:
                return
            fields = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            kind = fields.pop("kind", None)
            if route[1] != "commands" or not isinstance(kind, str):
                self._answer(400, {"error": "POST /api/instances/ID/commands with a kind"})
                return
            command = asyncio.run_coroutine_threadsafe(cp.send_command(route[0], kind, **fields), cp.loop).result(10)
            self._answer(201, {"command_id": command["command_id"], "seq": command["seq"]})

        def log_message(self, *args: Any) -> None:
            pass  # quiet

    return Api


async def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", type=Path, required=True)
    parser.add_argument("--token-file", type=Path, required=True, help="the bearer token (created, 0600, when missing)")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--api-port", type=int, default=8766)
    args = parser.parse_args()
    if not args.token_file.exists():
        args.token_file.touch(0o600)
        args.token_file.write_text(secrets.token_urlsafe(32))
    async with MinimalCP(args.db, args.token_file.read_text().strip(), port=args.port, api_port=args.api_port) as cp:
        print(f"driver link: {cp.url}  API: http://127.0.0.1:{cp.api_port}/api", flush=True)
        await asyncio.Future()  # until Ctrl-C


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main())
