"""A scripted upstream for the proxy's tests: answers each request with fixed chunks, spaced in time,
and records what it received (method, path, headers, body)."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class SpacedUpstream:
    """`chunks` are written one by one, `gap_s` apart, with chunked framing; `content_type` says what they are."""

    chunks: list[bytes]
    gap_s: float = 0.0
    content_type: str = "text/event-stream"
    status: int = 200
    cut_after: int | None = None  # close the connection after this many chunks, mid-answer
    received: list[Received] = field(default_factory=list)
    _server: asyncio.Server | None = None

    async def __aenter__(self) -> SpacedUpstream:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 2)

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        k, v = line.split(":", 1)
                        headers[k.strip().lower()] = v.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                self.received.append(Received(method, path, headers, body))
                writer.write(
                    f"HTTP/1.1 {self.status} OK\r\ncontent-type: {self.content_type}\r\n"
                    "transfer-encoding: chunked\r\nrequest-id: req_scripted\r\n\r\n".encode()
                )
                await writer.drain()
                for i, chunk in enumerate(self.chunks):
                    if self.cut_after is not None and i >= self.cut_after:
                        return  # `finally` closes the socket: the answer is cut
                    if i and self.gap_s:
                        await asyncio.sleep(self.gap_s)  # the upstream's pace, not a wait in a test
                    writer.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                    await writer.drain()
                writer.write(b"0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def anthropic_stream(model: str = "claude-sonnet-4-5", input_tokens: int = 100, output_tokens: int = 40) -> list[bytes]:
    """An Anthropic Messages stream, one event per chunk, as the API frames it."""
    import json

    def ev(name: str, data: dict[str, object]) -> bytes:
        return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()

    usage = {"input_tokens": input_tokens, "cache_read_input_tokens": 20, "cache_creation_input_tokens": 0}
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": model, "content": [], "usage": usage}
    chunks = [ev("message_start", {"type": "message_start", "message": message})]
    chunks.append(
        ev(
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        )
    )
    for word in ("one ", "two ", "three ", "four "):
        delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": word}}
        chunks.append(ev("content_block_delta", delta))
    chunks.append(ev("content_block_stop", {"type": "content_block_stop", "index": 0}))
    chunks.append(
        ev(
            "message_delta",
            {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": output_tokens}},
        )
    )
    chunks.append(ev("message_stop", {"type": "message_stop"}))
    return chunks
