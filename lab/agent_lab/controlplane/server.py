"""The reference control plane: a real WebSocket server for PROTOCOL §2-§4 over a durable store: a
SQLite file (embedded, one process) or a `postgresql://` database shared by N gateway processes
(`engine`, `pg_store`; docs/controlplane.md).

Used in-process by the integration and fault tests and embedded by `agent-driver dev`, and run on its
own by `agent-driver controlplane`. One `Link` per accepted connection; at most one per instance
(a newer one supersedes the older with 4409). Events are stored (and committed) before their receipt
is built, and every fault knob is applied in `_on_frame` / `_send_receipt` only.

The parts, mixed into `ControlPlane`: `handshake.LinkHandling` (accepting links, hello/welcome,
keepalive, closing), `intake.EventIntake` (frames, batches, receipts), `command_queue.CommandQueue`
(commands and their replay); `link` holds the per-connection record, close codes and tokens.
"""

from __future__ import annotations

import asyncio
import hmac
import ssl
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar, cast

import msgspec
from websockets.asyncio.server import Server, serve

from agent_lab.controlplane.command_queue import CommandQueue
from agent_lab.controlplane.engine import Engine, Notice, Reads, is_postgres, open_engine
from agent_lab.controlplane.faults import Faults
from agent_lab.controlplane.handshake import LinkHandling
from agent_lab.controlplane.intake import EventIntake
from agent_lab.controlplane.link import CLOSE_SUPERSEDED, CLOSE_TERMINATED, Link, TokenConfig, token_allows
from agent_lab.controlplane.live import Broker, Item, Subscription
from driver import logs
from driver.protocol.frames import (
    MAX_FRAME_BYTES,
    SUBPROTOCOL,
    TERMINAL_STATUSES,
)

if TYPE_CHECKING:
    from agent_lab.controlplane.console.config import ConsoleConfig
    from agent_lab.controlplane.console.queries import ConsoleQueries
    from agent_lab.controlplane.http_api import HttpListener

log = logs.get("agent_driver.controlplane")

R = TypeVar("R")


class ControlPlane(LinkHandling, EventIntake, CommandQueue):
    """`async with ControlPlane(db, tokens={"tok": {"drv-1"}}) as cp:` then point a driver at `cp.url`."""

    def __init__(
        self,
        db_path: str | Path,
        *,
        gateway_id: str = "gw-1",
        reuse_port: bool = False,
        gateway_port: int | None = None,
        max_handshakes: int = 512,
        tokens: TokenConfig,
        host: str = "127.0.0.1",
        port: int = 0,
        http_port: int | None = 0,
        path: str = "/driver",
        heartbeat_interval_ms: int = 5000,
        max_batch_events: int = 256,
        max_batch_bytes: int = 1_048_576,
        max_event_bytes: int = 262_144,
        hello_timeout_s: float = 10.0,
        close_timeout_s: float = 5.0,
        ssl_context: ssl.SSLContext | None = None,
        console: ConsoleConfig | None = None,
        operator_token: str | None = None,
    ) -> None:
        # The store: a SQLite file, or a `postgresql://` URL that several gateways share.
        self.store_url = str(db_path)
        # (With PostgreSQL, db_path only names where the console keeps uploads: beside no file.)
        self.db_path = Path(db_path) if not is_postgres(db_path) else Path(tempfile.gettempdir()) / f"cp-{gateway_id}"
        self.gateway_id = gateway_id
        # Gateways over one database may share one port (SO_REUSEPORT: the kernel spreads connections and
        # a dead gateway's share moves to the living); `gateway_port` is a second port of this one only.
        self.reuse_port = reuse_port
        self.gateway_port = gateway_port
        # Handshakes in flight (accepted, not yet welcomed) beyond this are closed with 1013 at once: in a
        # restart storm the driver backs off instead of every claim queueing behind the store.
        self.max_handshakes = max_handshakes
        self.handshakes = 0
        self.refused_busy = 0
        # The fault API's credential besides the console token (PROTOCOL §9): never a driver's token.
        self._operator_token = operator_token
        self.host = host
        self.port = port
        self.http_port = http_port
        self.path = path
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.max_batch_events = max_batch_events
        self.max_batch_bytes = max_batch_bytes
        self.max_event_bytes = max_event_bytes
        self.hello_timeout_s = hello_timeout_s
        # How long a close waits for the peer's close frame before dropping the TCP connection.
        self.close_timeout_s = close_timeout_s
        # With a server TLS context the link is wss:// (the HTTP API stays plain, on loopback).
        self.ssl_context = ssl_context
        # With a console config the HTTP port also serves the web console (and may leave loopback).
        self.console_config = console
        self.faults = Faults()
        self.refused_frames: list[int] = []  # sizes of frames refused with 1009 (fault knob)
        self._tokens: dict[str, frozenset[str] | None] = {
            t: (None if ids is None else frozenset(ids)) for t, ids in tokens.items()
        }
        self._links: dict[str, Link] = {}
        self._history: list[dict[str, Any]] = []
        self._heartbeats: dict[str, dict[str, Any]] = {}
        # One broker for the object's life: subscriptions and waits carry over a restart().
        self._live = Broker()
        self._server: Server | None = None
        self._servers: list[Server] = []
        self._http: HttpListener | None = None
        self.stopping = False  # set while stop() runs: ends the HTTP API's long polls (events?wait_ms=)
        self._engine: Engine | None = None
        self._reader: Reads | None = None
        self._background: set[asyncio.Task[None]] = set()

    # -- lifecycle ------------------------------------------------------------------------------

    async def __aenter__(self) -> ControlPlane:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()
        self._live.close_all()

    async def start(self) -> None:
        """Open the store and listen. After a `stop()`, listens again on the same ports."""
        from agent_lab.controlplane.http_api import start_http_api

        self.stopping = False
        engine = open_engine(self.store_url, self.gateway_id)
        engine.notices = self._on_notice
        await engine.start()
        self._engine = engine
        if self._reader is None:
            self._reader = engine.open_reads()
        self._server = await self._listen(self.port, self.reuse_port)
        self.port = self._server.sockets[0].getsockname()[1]
        self._servers = [self._server]
        if self.gateway_port is not None:
            self._servers.append(await self._listen(self.gateway_port, False))
            self.gateway_port = self._servers[-1].sockets[0].getsockname()[1]
        if self.http_port is not None:
            self._http = await start_http_api(self, self.http_port)
            self.http_port = self._http.port
        log.info("controlplane.started", url=self.url, http_url=self.http_url, store=self._engine.name)

    async def _listen(self, port: int, reuse_port: bool) -> Server:
        return await serve(
            self._handle,
            self.host,
            port,
            subprotocols=[SUBPROTOCOL],  # type: ignore[list-item]
            process_request=self._process_request,
            max_size=MAX_FRAME_BYTES,
            # Our own keepalive (`_keepalive`) pings and closes with 4408, as PROTOCOL §2.5 asks.
            ping_interval=None,
            ping_timeout=None,
            compression=None,
            close_timeout=self.close_timeout_s,
            ssl=self.ssl_context,
            reuse_port=reuse_port or None,
        )

    async def stop(self, close_code: int = 1001) -> None:
        """Close every link with `close_code` (1001 going away, 1012 restart), then stop listening."""
        self.stopping = True
        self._live.changed()
        await asyncio.gather(
            *(self._close(link.ws, close_code, "control plane stopping") for link in list(self._links.values()))
        )
        for server in self._servers:
            server.close()
            await server.wait_closed()
        self._servers = []
        self._server = None
        if self._http is not None:
            self._http.close()
            await self._http.wait_closed()
            self._http = None
        self._live.changed()
        if self._engine is not None:
            await self._engine.close()
            self._engine = None
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        log.info("controlplane.stopped")

    async def restart(self, close_code: int = 1012) -> None:
        """Stop and start again on the same ports and database. Links get `close_code`: 1012 (service
        restart) by default; 1006 drops every TCP connection without a close frame, like a crash."""
        await self.stop(close_code)
        await self.start()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        scheme = "ws" if self.ssl_context is None else "wss"
        return f"{scheme}://{host}:{self.port}{self.path}"

    @property
    def http_url(self) -> str | None:
        if self.http_port is None:
            return None
        host = "127.0.0.1" if self.console_config is None else self.console_config.host
        return f"http://{f'[{host}]' if ':' in host else host}:{self.http_port}"

    # -- queries (for tests and the HTTP API) ---------------------------------------------------

    def console_queries(self) -> ConsoleQueries:
        """The console's read connection for this control plane's engine."""
        from agent_lab.controlplane.console.queries import ConsoleQueries

        if not is_postgres(self.store_url):
            return ConsoleQueries(self.db_path)
        from agent_lab.controlplane.pg_reads import PgConsoleQueries

        return cast("ConsoleQueries", PgConsoleQueries(self.store_url))  # the same methods, duck-typed

    @property
    def gateway_url(self) -> str | None:
        """This gateway's own driver URL (`gateway_port`), None without one."""
        return None if self.gateway_port is None else self.url.replace(f":{self.port}/", f":{self.gateway_port}/", 1)

    @property
    def store(self) -> Reads:
        """A read connection on the event loop thread (sees every committed write); it stays usable
        after `stop()`, so a test can inspect the history once the control plane is gone."""
        if self._reader is None:
            self._reader = open_engine(self.store_url, self.gateway_id).open_reads()
        return self._reader

    def events(
        self,
        instance_id: str,
        kinds: Iterable[str] | str | None = None,
        run_id: str | None = None,
        after_seq: int | None = None,
        delivery: str | None = None,
    ) -> list[dict[str, Any]]:
        if isinstance(kinds, str):
            kinds = [kinds]
        return self.store.events(instance_id, kinds=kinds, run_id=run_id, after_seq=after_seq, delivery=delivery)

    def commands(self, instance_id: str) -> list[dict[str, Any]]:
        return self.store.commands(instance_id)

    def checkpoints(self, instance_id: str) -> list[dict[str, Any]]:
        """The instance's complete native checkpoints (PROTOCOL §8.1), oldest first."""
        return self.store.checkpoints(instance_id)

    def native_checkpoint(self, instance_id: str, folder: Path) -> dict[str, Any] | None:
        """`execution.native_checkpoint` from the instance's latest complete checkpoint (files in `folder`)."""
        from agent_lab.controlplane.checkpoints import native_checkpoint

        latest = self.store.latest_checkpoint(instance_id)
        return None if latest is None else native_checkpoint(latest, folder, self.store.checkpoint_blob)

    def command(self, command_id: str) -> dict[str, Any] | None:
        return self.store.command(command_id)

    def command_updates(self, command_id: str) -> list[dict[str, Any]]:
        return self.store.command_updates(command_id)

    def connected(self, instance_id: str) -> bool:
        link = self._links.get(instance_id)
        return link is not None and link.ready

    def connected_instances(self) -> list[str]:
        return sorted(i for i, link in self._links.items() if link.ready)

    def hello(self, instance_id: str) -> dict[str, Any] | None:
        """The `hello` of the instance's current link, as a dict."""
        link = self._links.get(instance_id)
        return None if link is None else msgspec.to_builtins(link.hello)  # type: ignore[no-any-return]

    def last_heartbeat(self, instance_id: str) -> dict[str, Any] | None:
        return self._heartbeats.get(instance_id)

    def is_operator(self, authorization: str | None) -> bool:
        """Whether an `Authorization` header carries the operator's token (`operator_token`)."""
        scheme, _, value = (authorization or "").partition(" ")
        expected = self._operator_token
        if not expected or scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(value.strip().encode(), expected.encode())

    def console_login_url(self) -> str | None:
        """A one-time login link to the console (None without a console or an HTTP port)."""
        if self._http is None or self._http.console is None or self.http_url is None:
            return None
        return self._http.console.login_url(self.http_url)

    def token_allows(self, authorization: str | None) -> bool | frozenset[str]:
        """For an `Authorization` header value: False, True (any instance) or the allowed instance ids."""
        return token_allows(self._tokens, authorization)

    def link_history(self, instance_id: str | None = None) -> list[dict[str, Any]]:
        """Every closed connection (refused ones too): instance, epoch, connection id, close code."""
        return [h for h in self._history if instance_id is None or h["instance_id"] == instance_id]

    # -- live -----------------------------------------------------------------------------------

    def subscribe(self, instance_id: str | None = None) -> Subscription:
        """Items from now on for one instance (or all): stored events, command updates, heartbeats,
        link up/down. Close it (or use it as a context manager) when done."""
        return self._live.subscribe(instance_id)

    async def wait_for(self, instance_id: str | None, predicate: Callable[[Item], bool], timeout: float = 10.0) -> Item:
        """The first live item (see `subscribe`) matching `predicate` from now on."""
        with self.subscribe(instance_id) as sub:
            async with asyncio.timeout(timeout):
                async for item in sub:
                    if predicate(item):
                        return item
        raise RuntimeError("control plane stopped while waiting")

    async def wait_for_event(
        self,
        instance_id: str,
        predicate: Callable[[dict[str, Any]], bool],
        timeout: float = 10.0,
        kinds: Iterable[str] | str | None = None,
    ) -> dict[str, Any]:
        """The first stored event (already stored or arriving later) for which `predicate` holds.

        `kinds` narrows the scan of what is already stored (worth it on long histories)."""
        wanted = {kinds} if isinstance(kinds, str) else (None if kinds is None else set(kinds))
        with self.subscribe(instance_id) as sub:
            for event in self.store.events(instance_id, kinds=wanted):
                if predicate(event):
                    return event
            async with asyncio.timeout(timeout):
                async for item in sub:
                    if item["type"] != "event" or (wanted is not None and item["kind"] not in wanted):
                        continue
                    event = {k: v for k, v in item.items() if k != "type"}
                    if predicate(event):
                        return event
        raise RuntimeError("control plane stopped while waiting")

    async def wait_until(self, condition: Callable[[], bool], timeout: float = 10.0) -> None:
        """Re-check `condition` after every change in the control plane until it holds."""
        async with asyncio.timeout(timeout):
            while not condition():
                await self._live.wait_change()

    async def wait_for_command_status(
        self, command_id: str, statuses: Iterable[str] | str = TERMINAL_STATUSES, timeout: float = 10.0
    ) -> dict[str, Any]:
        wanted = {statuses} if isinstance(statuses, str) else set(statuses)
        found: dict[str, Any] = {}

        def reached() -> bool:
            cmd = self.store.command(command_id)
            if cmd is not None and cmd["status"] in wanted:
                found.update(cmd)
                return True
            return False

        await self.wait_until(reached, timeout)
        return found

    async def wait_connected(self, instance_id: str, timeout: float = 10.0) -> None:
        await self.wait_until(lambda: self.connected(instance_id), timeout)

    async def wait_disconnected(self, instance_id: str, timeout: float = 10.0) -> None:
        await self.wait_until(lambda: instance_id not in self._links, timeout)

    # -- internals ------------------------------------------------------------------------------

    @property
    def engine(self) -> Engine:
        """The store's writes (each returns after its COMMIT)."""
        if self._engine is None:
            raise RuntimeError("control plane is not running")
        return self._engine

    def _on_notice(self, notice: Notice) -> None:
        """What another gateway (or this one) committed that concerns a link held here."""
        kind, instance_id, value = notice
        link = self._links.get(instance_id)
        if link is None:
            return
        if kind == "takeover" and link.generation < int(value):
            # Another link claimed the instance: this one stores nothing more (its generation is fenced).
            self._spawn(self._close(link.ws, CLOSE_SUPERSEDED, "superseded by a newer connection"))
        elif kind == "terminated":
            self._spawn(self._close(link.ws, CLOSE_TERMINATED, "terminated"))
        elif kind == "command" and link.ready and value not in link.sent_commands:
            self._spawn(self._send_stored_command(link, str(value)))

    async def _send_stored_command(self, link: Link, command_id: str) -> None:
        cmd = self.store.command(command_id)
        if cmd is not None:
            self._live.publish(link.instance_id, {"type": "command", "command_id": command_id, "kind": cmd["kind"]})
            await self._send_command(link, cmd)

    def _spawn(self, coro: Any) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
