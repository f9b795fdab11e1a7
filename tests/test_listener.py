"""The hardened loopback core on its own, with small limits: decided on the head, deadlines, caps."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from driver.net.listener import Exchange, Handler, Head, Limits, LoopbackServer, Reply

SMALL = Limits(
    max_connections=4,
    max_per_client=4,
    head_timeout_s=0.5,
    idle_timeout_s=0.5,
    body_timeout_s=0.5,
    max_body_bytes=1000,
    max_buffered_bytes=1500,
)


@asynccontextmanager
async def serving(limits: Limits = SMALL) -> AsyncIterator[tuple[LoopbackServer, list[bytes]]]:
    bodies: list[bytes] = []

    async def echo(exchange: Exchange) -> None:
        body = await exchange.body()
        bodies.append(body)
        await exchange.reply(Reply(200, body))

    def decide(head: Head) -> Reply | Handler:
        if head.header(b"authorization") != "Bearer ok":
            return Reply(401, b"no")
        return echo

    server = LoopbackServer(decide, name="test", limits=limits)
    await server.start()
    try:
        yield server, bodies
    finally:
        await server.close()


async def request(port: int, raw: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()


async def until(condition: Callable[[], bool]) -> None:
    """Poll the server's own counters (nothing announces an accept) until `condition`, within 3 s."""
    async with asyncio.timeout(3):
        while not condition():  # noqa: ASYNC110 (a counter, not an event)
            await asyncio.sleep(0.005)


def post(body: bytes, key: str = "ok", length: int | None = None) -> bytes:
    n = len(body) if length is None else length
    return f"POST /x HTTP/1.1\r\nhost: h\r\nauthorization: Bearer {key}\r\ncontent-length: {n}\r\n\r\n".encode() + body


async def test_a_keyless_request_is_refused_on_its_head_and_its_body_never_read() -> None:
    async with serving() as (server, bodies):
        answer = await request(server.port, post(b"", key="bad", length=10**9))
        assert answer.startswith(b"HTTP/1.1 401") and bodies == []
        assert (await request(server.port, post(b"hello"))).endswith(b"hello")


async def test_idle_and_slow_heads_are_closed_by_the_deadlines() -> None:
    async with serving() as (server, _):
        idle = await asyncio.open_connection("127.0.0.1", server.port)
        slow = await asyncio.open_connection("127.0.0.1", server.port)
        slow[1].write(b"POST /x HTTP/1.1\r\nhost: h\r\n")  # a head never finished
        assert await asyncio.wait_for(idle[0].read(), 3) == b""
        assert (await asyncio.wait_for(slow[0].read(), 3)).startswith(b"HTTP/1.1 408")
        for _, writer in (idle, slow):
            writer.close()
        assert server.connections == 0


async def test_a_body_that_never_comes_or_is_too_large_is_refused() -> None:
    async with serving() as (server, bodies):
        assert (await request(server.port, post(b"abc", length=10))).startswith(b"HTTP/1.1 408")
        assert (await request(server.port, post(b"", length=5000))).startswith(b"HTTP/1.1 413")
        assert bodies == []


async def test_a_full_listener_closes_its_oldest_undecided_connection_for_a_new_one() -> None:
    async with serving() as (server, _):
        held = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(4)]
        await until(lambda: server.connections == 4)
        answer = await request(server.port, post(b"served"))
        assert answer.endswith(b"served")
        assert await asyncio.wait_for(held[0][0].read(), 3) == b""  # the oldest made room
        for _, writer in held:
            writer.close()


async def test_bodies_held_at_once_are_bounded() -> None:
    async with serving() as (server, _):
        # One request holds 900 of the 1500 bytes while its body trickles; a second of 900 is refused.
        _reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(post(b"x" * 10, length=900))
        await writer.drain()
        await until(lambda: server.pool.used == 900)
        second = await request(server.port, post(b"y" * 900))
        assert second.startswith(b"HTTP/1.1 503"), second[:40]
        writer.close()
