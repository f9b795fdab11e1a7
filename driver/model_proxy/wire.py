"""The provider side's HTTP/1.1 plumbing (h11 on asyncio streams): reading a request whole, writing
an answer's pieces, refusals in the upstream's error shape, and the upstream client's construction.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from typing import TYPE_CHECKING

import h11

from driver.model_proxy import errors
from driver.model_proxy.usage import Dialect

if TYPE_CHECKING:
    import httpx2

MAX_REQUEST_BYTES = 32 * 1024 * 1024
READ_SIZE = 64 * 1024
# Headers that describe one hop, not the message: never forwarded either way.
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        b"content-length",
        b"accept-encoding",
    }
)
# Where a provider puts its key: Anthropic's x-api-key, Bearer tokens (OpenAI, OAuth), Azure's api-key.
CREDENTIAL_HEADERS = (b"x-api-key", b"authorization", b"api-key")


class ClientGone(Exception):
    """The provider closed its connection."""


async def read_request(
    conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> tuple[h11.Request, bytes] | None:
    request: h11.Request | None = None
    body = bytearray()
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError as exc:
            await refuse_raw(conn, writer, errors.BAD_REQUEST, None, f"malformed request: {exc}")
            return None
        if event is h11.NEED_DATA:
            if conn.they_are_waiting_for_100_continue:
                # curl and others hold a large body back until told to send it.
                await send(writer, conn.send(h11.InformationalResponse(status_code=100, headers=[])))
            data = await reader.read(READ_SIZE)
            if not data and request is None and conn.their_state is h11.IDLE:
                return None  # keep-alive connection closed between requests
            conn.receive_data(data)
            continue
        if isinstance(event, h11.Request):
            request = event
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > MAX_REQUEST_BYTES:
                await refuse_raw(conn, writer, errors.TOO_LARGE, None, "request body too large")
                return None
        elif isinstance(event, h11.EndOfMessage):
            assert request is not None
            return request, bytes(body)
        elif isinstance(event, h11.ConnectionClosed):
            return None
        # h11.PAUSED cannot happen before the response; other events carry nothing for us.


async def refuse(
    conn: h11.Connection, writer: asyncio.StreamWriter, kind: errors.Kind, shape: Dialect | None, message: str
) -> None:
    status, payload = errors.body(kind, shape, message)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
        (b"x-should-retry", b"false"),
    ]
    await send(writer, conn.send(h11.Response(status_code=status, headers=headers)))
    await send(writer, conn.send(h11.Data(data=payload)))
    await send(writer, conn.send(h11.EndOfMessage()))


async def refuse_raw(
    conn: h11.Connection, writer: asyncio.StreamWriter, kind: errors.Kind, shape: Dialect | None, message: str
) -> None:
    """A refusal before a whole request was read: the connection closes after it."""
    if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
        with contextlib.suppress(h11.LocalProtocolError, ClientGone, ConnectionError):
            await refuse(conn, writer, kind, shape, message)


async def send(writer: asyncio.StreamWriter, data: bytes | None) -> None:
    if not data:
        return
    try:
        writer.write(data)
        await writer.drain()
    except (ConnectionError, RuntimeError) as exc:
        raise ClientGone from exc


def new_client(timeout_s: float) -> httpx2.AsyncClient:
    import httpx2

    timeout = httpx2.Timeout(connect=timeout_s, read=None, write=timeout_s, pool=None)
    if any(os.environ.get(name) for name in PROXY_VARIABLES):
        # The sandbox's egress proxy applies to the upstream, as it would to the provider (httpx2 reads
        # the variables, NO_PROXY included, only for a client without its own transport).
        return httpx2.AsyncClient(timeout=timeout, trust_env=True, follow_redirects=False)
    # TCP_NODELAY towards the upstream: httpcore2 writes a request's head and body apart, and anyio's
    # sockets do not set it, so the body would wait ~40 ms for the head's delayed ACK.
    transport = httpx2.AsyncHTTPTransport(socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
    return httpx2.AsyncClient(timeout=timeout, trust_env=True, follow_redirects=False, transport=transport)


PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
