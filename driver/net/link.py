"""The WebSocket link: dial, handshake, send batches and heartbeats, receive, reconnect.

All decisions (which frame is allowed when, what a close code means, how long to wait) are made by
`driver.protocol.link.LinkCore`; this module only does the I/O around it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import anyio
import anyio.lowlevel
import msgspec
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from driver import logs, tasks
from driver.protocol.batching import BatchLimit
from driver.protocol.boot import ControlConfig
from driver.protocol.dial_report import DialReporter
from driver.protocol.frames import (
    MAX_FRAME_BYTES,
    SUBPROTOCOL,
    CommandFrame,
    FrameError,
    InvalidCommand,
    Receipt,
    Welcome,
    decode_inbound,
    encode_events_frame,
)
from driver.protocol.link import CloseReaction, LinkCore, LinkPhase, ProtocolViolation
from driver.queue.outbox import Outbox

log = logs.get("driver.link")

CLOSE_TOO_BIG = 1009


class TransportRefused(ValueError):
    pass


def check_transport(control: ControlConfig) -> None:
    """ws:// is only for a loopback host unless insecure_transport says otherwise (PROTOCOL §1)."""
    parts = urlsplit(control.url)
    if parts.scheme not in ("ws", "wss"):
        raise TransportRefused("control.url must be a ws:// or wss:// URL")
    if not parts.hostname:
        raise TransportRefused("control.url has no host")
    if parts.username or parts.password or "token" in (parts.query or "").lower():
        raise TransportRefused("control.url must not carry credentials (the token goes in a header)")
    if parts.scheme == "ws" and not control.insecure_transport and not is_loopback(parts.hostname):
        raise TransportRefused("control.url uses ws:// to a non-loopback host (set insecure_transport to allow)")
    if parts.scheme == "wss" and control.ca_file:
        # Loaded once here so a missing or unparsable file is a configuration error (exit 78), not a
        # dial failure retried forever.
        try:
            ssl_context(control)
        except OSError as exc:
            raise TransportRefused(f"control.ca_file cannot be read ({exc.strerror or 'unreadable'})") from None
        except ssl.SSLError:
            raise TransportRefused("control.ca_file holds no usable PEM certificate") from None


def is_loopback(host: str) -> bool:
    """True for a loopback address or `localhost`; names are not resolved (a name could point anywhere)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def ssl_context(control: ControlConfig) -> ssl.SSLContext | None:
    if urlsplit(control.url).scheme != "wss":
        return None
    ctx = ssl.create_default_context()  # verifies certificates and host names
    if control.ca_file:
        ctx.load_verify_locations(cafile=control.ca_file)
    return ctx


class LinkHooks(msgspec.Struct):
    hello: Callable[[], bytes]
    heartbeat: Callable[[], bytes]
    on_welcome: Callable[[Welcome], Awaitable[None]]
    on_command: Callable[[CommandFrame | InvalidCommand, bytes], Awaitable[None]]
    # Not awaited: reporting admits into the outbox, which only this link's sender can empty (the
    # reader and the sender must never wait for admission).
    on_final_rejections: Callable[[list[Any]], None]


class Link:
    def __init__(
        self,
        control: ControlConfig,
        instance_id: str,
        outbox: Outbox,
        hooks: LinkHooks,
        core: LinkCore | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._control = control
        self._instance_id = instance_id
        self._outbox = outbox
        self._hooks = hooks
        self.core = core or LinkCore()
        self._clock = clock
        self._ws: ClientConnection | None = None
        # fast_acquire: an uncontended acquire does not yield to the event loop first. A batch whose
        # events are journaled goes out at once instead of after one more turn of the loop (every
        # ready callback runs in that turn: measured as part of the driver's emit → receipt tail,
        # issue 10). The sender yields after each send instead, so a backlog still shares the loop.
        self._send_lock = anyio.Lock(fast_acquire=True)
        self.connected = anyio.Event()
        # Set once the first dial ended: `hello` sent, or the dial failed. The kernel starts its
        # provider after it, so the control plane hears from a new driver before the provider's
        # imports and spawn take the event loop (issue 10's spawn → hello).
        self.first_dial_done = anyio.Event()
        self.reconnects = 0
        self.batches = BatchLimit(MAX_FRAME_BYTES)
        self._clamps_logged: set[tuple[str, int]] = set()
        # Why the last dial failed before a socket was open (None: it opened); read when the redial
        # is scheduled, where the delay is known (driver.protocol.dial_report says what is logged).
        self.dials = DialReporter(control.url)
        self._dial_error: str | None = None

    @property
    def is_open(self) -> bool:
        return self._ws is not None and self.core.phase is LinkPhase.OPEN

    async def send(self, frame: bytes) -> bool:
        """Send one frame if the link is open; False if it is not (the caller relies on replay)."""
        ws = self._ws
        if ws is None or self.core.phase is not LinkPhase.OPEN:
            return False
        try:
            async with self._send_lock:
                await ws.send(frame, text=True)
            return True
        except ConnectionClosed:
            return False

    async def close(self, code: int = 1000, reason: str = "") -> None:
        if self._ws is not None:
            await self._ws.close(code, reason)

    async def run(self) -> CloseReaction:
        """Dial and redial until a close code says stop; return that reaction."""
        first = await self._dial()
        if not first.reconnect:
            return first
        # Redials under tenacity, imported after the first dial (nothing of it on the way to `hello`);
        # that dial is tenacity's first attempt. The delays are the link core's (full jitter, reset
        # after a stable minute: sans-I/O); the close code decides whether to go on.
        from tenacity import AsyncRetrying, RetryCallState, retry_if_result, stop_never

        done = [first]

        async def dial() -> CloseReaction:
            return done.pop() if done else await self._dial()

        def reconnecting(state: RetryCallState) -> None:
            assert state.outcome is not None and state.next_action is not None
            self.reconnects += 1
            delay = state.next_action.sleep
            if self._dial_error is not None:
                self._report_dial_failure(self._dial_error, delay)
                self._dial_error = None
                return
            reason = state.outcome.result().reason
            log.info("link.reconnecting", delay_s=round(delay, 3), reason=reason)

        retrying = AsyncRetrying(
            retry=retry_if_result(lambda reaction: bool(reaction.reconnect)),
            wait=lambda state: self.core.next_delay(),
            stop=stop_never,
            sleep=anyio.sleep,
            before_sleep=reconnecting,
            reraise=True,
        )
        reaction: CloseReaction = await retrying(dial)
        return reaction

    def _report_dial_failure(self, error: str, delay: float) -> None:
        """A warning for the first failed dial of a streak and one a minute after it; debug between."""
        report = self.dials.failed(self._clock(), error, delay)
        if report is not None:
            log.warning("link.dial_failed", **report.fields())
        else:
            log.debug("link.dial_failed", url=self.dials.url, attempts=self.dials.attempts, error=error)

    async def _dial(self) -> CloseReaction:
        """One connection, with a bug outside its tasks (the dial, the close bookkeeping) contained: it
        is logged and counts as a lost link, so the loop redials after backoff (PROTOCOL §9)."""
        try:
            return await self._connect_once()
        except Exception as exc:
            log.error("link.dial_crashed", error_type=type(exc).__name__, exc_info=True)
            self._ws = None
            return self.core.closed(None, self._clock())

    async def _connect_once(self) -> CloseReaction:
        headers = {
            "Authorization": f"Bearer {self._control.token}",
            "Agent-Driver-Instance": self._instance_id,
        }
        try:
            ws = await connect(
                self._control.url,
                subprotocols=[SUBPROTOCOL],  # type: ignore[list-item]
                additional_headers=headers,
                ssl=ssl_context(self._control),
                max_size=MAX_FRAME_BYTES,
                ping_interval=None,  # liveness is ours: pings plus app heartbeats at the CP's interval
                open_timeout=10,
                close_timeout=5,
                compression=None,
            )
        except InvalidStatus as exc:
            self.first_dial_done.set()
            status = exc.response.status_code
            code = {401: 4401, 403: 4403}.get(status)
            if code is not None:
                log.warning("link.refused", http_status=status, url=self.dials.url)
            else:
                self._dial_error = f"HTTP {status} (no driver WebSocket endpoint at this URL)"
            return self.core.closed(code, self._clock())
        except (OSError, InvalidHandshake, TimeoutError) as exc:
            self.first_dial_done.set()
            self._dial_error = f"{type(exc).__name__}: {str(exc)[:200]}" if str(exc) else type(exc).__name__
            return self.core.closed(None, self._clock())
        self._ws = ws
        try:
            try:
                await ws.send(self._hooks.hello(), text=True)
            finally:
                self.first_dial_done.set()
            self.core.connected(self._clock())
            async with tasks.within("link connection") as tg:
                tg.spawn(self._watchdog, ws, tg.cancel_scope)
                async for raw in ws:
                    data = raw.encode() if isinstance(raw, str) else raw
                    await self._handle(ws, data, tg)
                tg.cancel_scope.cancel()
        except* ConnectionClosed:
            pass
        except* ProtocolViolation as group:
            detail = str(group.exceptions[0])
            log.warning("link.protocol_violation", detail=detail)
            await ws.close(4400, detail[:120])
        except* Exception as group:
            # A bug in one of this connection's tasks (sender, heartbeats, watchdog, a frame's
            # handling): this connection ends (1011, "internal error") and the next dial starts afresh;
            # the outbox resends whatever had no receipt. The process carries on.
            first = group.exceptions[0]
            log.error("link.task_failed", error_type=type(first).__name__, exc_info=True)
            with contextlib.suppress(Exception):
                await ws.close(1011, "driver internal error")
        finally:
            self._ws = None
            self.connected = anyio.Event()
            self._outbox.on_link_down()
            # close_code is the code the peer sent, or ours (4400, 4408) when we closed first.
            code = ws.close_code
            if code == 1005:  # "no status received": treat like an abnormal end
                code = 1006
        reaction = self.core.closed(code, self._clock())
        # The code we sent, when we closed first (1009 for a frame over 4 MiB, 4400, 4408): a CP that
        # never answers the close frame leaves `code` at 1006, and the log must still say why.
        sent = ws.protocol.close_sent.code if ws.protocol.close_sent is not None else None
        # The CP refused a frame of ours (§4.3): its 1009 came first (our close frame then echoes it).
        rcvd = ws.protocol.close_rcvd
        if rcvd is not None and rcvd.code == CLOSE_TOO_BIG and ws.protocol.close_rcvd_then_sent is not False:
            await self._refused_too_big()
        # Outbox statistics at every link change: what is waiting, how old, how often retried, drops.
        log.info("link.closed", code=code, sent=sent, reaction=reaction.reason, outbox=self._outbox.describe())
        return reaction

    async def _handle(self, ws: ClientConnection, data: bytes, tg: tasks.Tasks) -> None:
        try:
            frame = decode_inbound(data)
        except FrameError as exc:
            # An unreadable frame is the CP's bug; name it and carry on rather than drop the link.
            log.warning("link.bad_frame", detail=str(exc)[:300])
            return
        frame = self.core.frame(frame, self._clock())
        if isinstance(frame, Welcome):
            self.dials.opened()
            self._log_clamps()
            log.info(
                "link.open",
                connection_id=frame.connection_id,
                heartbeat_ms=frame.heartbeat_interval_ms,
                outbox=self._outbox.describe(),
            )
            self._outbox.on_link_up()
            await self._hook("on_welcome", self._hooks.on_welcome, frame)
            self.connected.set()
            tg.spawn(self._sender, ws, frame)
            tg.spawn(self._heartbeats, ws, frame)
        elif isinstance(frame, Receipt):
            finals = self._outbox.on_receipt(frame)
            if finals:
                try:
                    self._hooks.on_final_rejections(finals)  # never waits (issue 19)
                except Exception as exc:
                    name = type(exc).__name__
                    log.error("link.hook_failed", hook="on_final_rejections", error_type=name, exc_info=True)
        else:
            await self._hook("on_command", self._hooks.on_command, frame, data)

    async def _hook(self, name: str, fn: Callable[..., Awaitable[None]], *args: Any) -> None:
        """A hook's unexpected error is the kernel's fault, not the link's: logged, the link goes on
        (the kernel's hooks report their own failures; this is the last line)."""
        try:
            await fn(*args)
        except Exception as exc:
            log.error("link.hook_failed", hook=name, error_type=type(exc).__name__, exc_info=True)

    def _log_clamps(self) -> None:
        """Once per process for each field and value: a CP sends the same welcome at every reconnect."""
        for c in self.core.clamps:
            if (c.field, c.given) in self._clamps_logged:
                continue
            self._clamps_logged.add((c.field, c.given))
            log.warning("link.welcome_clamped", field=c.field, given=c.given, used=c.used, why=c.why)

    async def _sender(self, ws: ClientConnection, welcome: Welcome) -> None:
        max_events = max(1, welcome.max_batch_events)
        self.batches.connected()
        max_bytes = self.batches.limit(welcome.max_batch_bytes)
        while True:
            await self._outbox.wait_sendable()
            batch = self._outbox.take_batch(max_events, max_bytes)
            if finals := self._outbox.take_local_rejections():
                self._hooks.on_final_rejections(finals)
            if batch is None:
                await anyio.lowlevel.checkpoint()
                continue
            frame = encode_events_frame(batch.number, batch.frame_events)
            self.batches.sent(len(frame))
            async with self._send_lock:
                await ws.send(frame, text=True)
            # `ws.send` only waits when the socket's buffer is full, which a loopback CP rarely lets
            # happen: without this, replaying a backlog would hold the loop (receipts, heartbeats,
            # the watchdog) until the last batch was written.
            await anyio.lowlevel.checkpoint()

    async def _refused_too_big(self) -> None:
        """PROTOCOL §4.3: 1009 halves the batch size for this link; at the floor, the oldest event
        (the one no frame can carry) is finally rejected, so it is never sent again."""
        largest = self.batches.largest_sent
        if self.batches.refused():
            finals = self._outbox.reject_oldest(
                "event.too_large", "the control plane refused it at the smallest frame size"
            )
            log.error("link.too_big_at_floor", frame_bytes=largest)
            if finals:
                self._hooks.on_final_rejections(finals)
        else:
            log.warning("link.too_big", frame_bytes=largest, batch_bytes=self.batches.cap)

    async def _heartbeats(self, ws: ClientConnection, welcome: Welcome) -> None:
        interval = max(0.05, welcome.heartbeat_interval_ms / 1000.0)
        while True:
            await anyio.sleep(interval)
            pong = await ws.ping()
            async with self._send_lock:
                await ws.send(self._hooks.heartbeat(), text=True)
            with anyio.move_on_after(interval):
                await pong
                self.core.heard(self._clock())

    async def _watchdog(self, ws: ClientConnection, scope: anyio.CancelScope) -> None:
        """Welcome timeout, silence for 3 heartbeat intervals, and the outbox's retry timers."""
        while True:
            wait = self._outbox.expire()
            tick = min(wait if wait is not None else 0.5, 0.5)
            await anyio.sleep(max(0.01, tick))
            verdict = self.core.deadline(self._clock(), self.core.heartbeat_s)
            if verdict is not None:
                log.warning("link.dropping", reason=verdict)
                await ws.close(4408 if verdict == "silent" else 1002, verdict)
                scope.cancel()
                return
