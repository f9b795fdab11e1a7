"""The link of one driver connection: close codes, the `Link` record, bearer tokens, and the close
code that ended a connection. No I/O here: accepting and closing links is in `handshake`."""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from websockets.asyncio.server import ServerConnection

from agent_lab.controlplane.store_rows import BatchResult
from driver.protocol.frames import (
    Hello,
)

if TYPE_CHECKING:
    pass

CLOSE_PROTOCOL = 4400
CLOSE_TOO_BIG = 1009  # a frame over the fault knob max_frame_bytes (PROTOCOL §4.3)
CLOSE_UNAUTHORIZED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_HEARTBEAT = 4408
CLOSE_SUPERSEDED = 4409
CLOSE_TERMINATED = 4410
CLOSE_TRY_LATER = 1013  # too many handshakes in flight: the driver backs off and redials
ABORT = 1006  # not a sendable close code: "close" with it means dropping the TCP connection

# A token maps to the instance ids it may drive; None means any instance.
TokenConfig = Mapping[str, Iterable[str] | None]


class Link:
    """One accepted connection that completed the handshake for an instance."""

    def __init__(self, ws: ServerConnection, instance_id: str, hello: Hello, connection_id: str) -> None:
        self.ws = ws
        self.instance_id = instance_id
        self.epoch = hello.epoch
        self.hello = hello
        self.connection_id = connection_id
        self.ready = False  # welcome sent: commands may flow
        self.generation = 0  # the link generation its claim took: its batches are stored only while it holds
        self.sent_commands: set[str] = set()
        self.held_receipt: bytes | None = None
        # Batches whose store write is under way, in arrival order: receipts go out in this order.
        self.receipts: asyncio.Queue[tuple[int, asyncio.Future[BatchResult]]] = asyncio.Queue()
        self.last_heard = asyncio.get_running_loop().time()
        self.tasks: set[asyncio.Task[None]] = set()

    def spawn(self, coro: Any) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)


def sendable_close_code(code: int) -> bool:
    """Codes a close frame may carry (RFC 6455 §7.4), plus 1006 which we emulate by dropping TCP."""
    return code in (1000, 1001, 1002, 1003, ABORT) or 1007 <= code <= 1014 or 3000 <= code <= 4999


def close_of(ws: ServerConnection) -> tuple[int, str]:
    """The close code that ended a connection: ours if we closed first (even when the peer never
    answered), else the peer's; 1006 when no close frame went either way."""
    proto = ws.protocol
    if proto.close_sent is not None and (proto.close_rcvd is None or not proto.close_rcvd_then_sent):
        return proto.close_sent.code, proto.close_sent.reason
    if proto.close_rcvd is not None:
        return proto.close_rcvd.code, proto.close_rcvd.reason
    return ABORT, ""


def token_allows(tokens: Mapping[str, frozenset[str] | None], authorization: str | None) -> bool | frozenset[str]:
    """False for a bad token; True when it allows any instance; else the set of allowed instance ids.

    Every configured token is compared in constant time, so timing does not reveal a prefix.
    """
    if not authorization:
        return False
    scheme, _, presented = authorization.partition(" ")
    if scheme.lower() != "bearer" or not presented.strip():
        return False
    presented_b = presented.strip().encode()
    match: bool | frozenset[str] = False
    for token, allowed in tokens.items():
        if hmac.compare_digest(token.encode(), presented_b):
            match = True if allowed is None else allowed
    return match
