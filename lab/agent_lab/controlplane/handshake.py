# mypy: disable-error-code="misc"
# (mypy allows a mixin's `self: ControlPlane` only for protocols; the annotation is what types these methods.)
"""Accepting links (PROTOCOL §2): the HTTP upgrade check, bearer token and instance, hello → welcome
with epoch fencing and supersession, the command replay after welcome, keepalive, and closing."""

from __future__ import annotations

import asyncio
import contextlib
import http
import uuid
from typing import TYPE_CHECKING, Any

from websockets.asyncio.server import ServerConnection
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from agent_lab.controlplane.link import (
    ABORT,
    CLOSE_FORBIDDEN,
    CLOSE_HEARTBEAT,
    CLOSE_PROTOCOL,
    CLOSE_SUPERSEDED,
    CLOSE_TERMINATED,
    CLOSE_TRY_LATER,
    CLOSE_UNAUTHORIZED,
    Link,
    close_of,
    sendable_close_code,
    token_allows,
)
from agent_lab.controlplane.store_rows import now_iso
from driver import logs
from driver.protocol.frames import (
    PROTOCOL_VERSION,
    SUBPROTOCOL,
    Hello,
    Welcome,
    encode,
)

log = logs.get("agent_driver.controlplane")

if TYPE_CHECKING:
    pass
if TYPE_CHECKING:
    from agent_lab.controlplane.server import ControlPlane


class LinkHandling:
    """Mixed into `ControlPlane`: one `_handle` per accepted connection."""

    def _process_request(self: ControlPlane, ws: ServerConnection, request: Request) -> Response | None:
        if request.path.split("?", 1)[0] != self.path:
            return ws.respond(http.HTTPStatus.NOT_FOUND, "not found\n")
        offered = [p.strip() for h in request.headers.get_all("Sec-WebSocket-Protocol") for p in h.split(",")]
        if SUBPROTOCOL not in offered:
            return ws.respond(http.HTTPStatus.BAD_REQUEST, f"subprotocol {SUBPROTOCOL} required\n")
        return None

    def _authorize(self: ControlPlane, headers: Headers) -> tuple[int | None, str, str | None]:
        """(close code or None, reason, instance id)."""
        if self.faults.reject_auth:
            return CLOSE_UNAUTHORIZED, "token rejected", None
        allowed = token_allows(self._tokens, headers.get("Authorization"))
        if allowed is False:
            return CLOSE_UNAUTHORIZED, "bad or missing bearer token", None
        instance_id = headers.get("Agent-Driver-Instance")
        if not instance_id:
            return CLOSE_PROTOCOL, "Agent-Driver-Instance header missing", None
        if allowed is not True and instance_id not in allowed:
            return CLOSE_FORBIDDEN, "instance not allowed for this token", instance_id
        return None, "", instance_id

    async def _handle(self: ControlPlane, ws: ServerConnection) -> None:
        connection_id = f"con-{uuid.uuid4().hex[:20]}"
        assert ws.request is not None
        code, reason, instance_id = self._authorize(ws.request.headers)
        record: dict[str, Any] = {
            "connection_id": connection_id,
            "instance_id": instance_id,
            "epoch": None,
            "opened_at": now_iso(),
        }
        link: Link | None = None
        try:
            if code is not None:
                log.warning("link.refused", instance_id=instance_id, code=code, reason=reason)
                await self._close(ws, code, reason)
                return
            assert instance_id is not None
            if self.handshakes >= self.max_handshakes:
                self.refused_busy += 1
                await self._close(ws, CLOSE_TRY_LATER, "too many handshakes in flight; try later")
                return
            self.handshakes += 1
            try:
                link = await self._handshake(ws, instance_id, connection_id, record)
            finally:
                self.handshakes -= 1
            if link is None:
                return
            keepalive = asyncio.ensure_future(self._keepalive(link))
            link.spawn(self._answer_batches(link))
            try:
                async for message in ws:
                    if not await self._on_frame(link, message):
                        break
            except ConnectionClosed:
                pass
            finally:
                keepalive.cancel()
        finally:
            if link is not None:
                for task in list(link.tasks):
                    task.cancel()
                if self._links.get(link.instance_id) is link:
                    del self._links[link.instance_id]
            await ws.wait_closed()
            close_code, close_reason = close_of(ws)
            record.update(closed_at=now_iso(), close_code=close_code, close_reason=close_reason)
            self._history.append(record)
            if link is not None:
                self._live.publish(
                    link.instance_id,
                    {"type": "link", "state": "down", "connection_id": connection_id, "close_code": close_code},
                )
            else:
                self._live.changed()
            log.info("link.closed", instance_id=instance_id, connection_id=connection_id, code=close_code)

    async def _handshake(
        self: ControlPlane, ws: ServerConnection, instance_id: str, connection_id: str, record: dict[str, Any]
    ) -> Link | None:
        try:
            raw = await asyncio.wait_for(ws.recv(), timeout=self.hello_timeout_s)
        except TimeoutError:
            await self._close(ws, CLOSE_HEARTBEAT, "no hello")
            return None
        except ConnectionClosed:
            return None
        hello = self._decode(raw)
        if not isinstance(hello, Hello):
            await self._close(ws, CLOSE_PROTOCOL, "the first frame must be hello")
            return None
        record["epoch"] = hello.epoch
        if hello.protocol != PROTOCOL_VERSION:
            await self._close(ws, CLOSE_PROTOCOL, f"unsupported protocol {hello.protocol}")
            return None
        if hello.driver_instance_id != instance_id:
            await self._close(ws, CLOSE_PROTOCOL, "hello.driver_instance_id differs from the header")
            return None
        verdict = await self.engine.claim(instance_id, hello.epoch)
        if verdict.terminated:
            await self._close(ws, CLOSE_TERMINATED, "instance terminated")
            return None
        old = self._links.get(instance_id)
        if not verdict.allowed or (old is not None and old.epoch > hello.epoch):
            await self._close(ws, CLOSE_SUPERSEDED, f"epoch {hello.epoch} is older than {verdict.highest}")
            return None
        link = Link(ws, instance_id, hello, connection_id)
        link.generation = verdict.generation
        self._links[instance_id] = link
        if old is not None:
            # The newest link owns the instance; the older one is told so and closed. In the background:
            # a silent old peer must not hold up this welcome for the whole close timeout.
            self._spawn(self._close(old.ws, CLOSE_SUPERSEDED, "superseded by a newer connection"))
        welcome = Welcome(
            connection_id=connection_id,
            heartbeat_interval_ms=self.heartbeat_interval_ms,
            max_batch_events=self.max_batch_events,
            max_batch_bytes=self.max_batch_bytes,
            max_event_bytes=self.max_event_bytes,
            accepted_capabilities=[c.id for c in hello.capabilities if c.supported],
        )
        try:
            await ws.send(encode(welcome).decode())
        except ConnectionClosed:
            return link
        link.ready = True
        log.info("link.open", instance_id=instance_id, epoch=hello.epoch, connection_id=connection_id)
        self._live.publish(
            instance_id, {"type": "link", "state": "up", "connection_id": connection_id, "epoch": hello.epoch}
        )
        for cmd in self.store.pending_commands(instance_id, hello.last_command_seq):
            await self._send_command(link, cmd)
        return link

    async def _keepalive(self: ControlPlane, link: Link) -> None:
        """Ping every interval; close with 4408 when nothing was heard for three intervals."""
        loop = asyncio.get_running_loop()
        interval = self.heartbeat_interval_ms / 1000

        def heard(fut: asyncio.Future[float]) -> None:
            if not fut.cancelled() and fut.exception() is None:
                link.last_heard = loop.time()

        try:
            while True:
                await asyncio.sleep(interval)
                if loop.time() - link.last_heard > 3 * interval:
                    log.warning("link.heartbeat_timeout", instance_id=link.instance_id)
                    await self._close(link.ws, CLOSE_HEARTBEAT, "heartbeat timeout")
                    return
                waiter = asyncio.ensure_future(await link.ws.ping())
                waiter.add_done_callback(heard)
        except ConnectionClosed:
            return

    async def _close(self: ControlPlane, ws: ServerConnection, code: int, reason: str) -> None:
        if not sendable_close_code(code):
            raise ValueError(f"close code {code} cannot be sent (use 1000-1003, 1007-1014, 3000-4999 or 1006)")
        if code == ABORT:
            if ws.transport is not None:
                ws.transport.abort()
            return
        with contextlib.suppress(ConnectionClosed):
            await ws.close(code, reason)
