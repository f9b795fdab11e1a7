"""Minimal HTTP/1.1 for the control plane's port: read one request head, write one response.

One request per connection (`Connection: close`); bodies by `Content-Length` only. It serves a
browser and a CLI on a trusted network, nothing else.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

MAX_HEAD = 64 * 1024
HEAD_TIMEOUT_S = 30.0


class HttpError(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Request:
    method: str
    target: str
    headers: dict[str, str]
    reader: asyncio.StreamReader

    @property
    def parts(self) -> list[str]:
        return [unquote(p) for p in urlsplit(self.target).path.strip("/").split("/")]

    @property
    def query(self) -> dict[str, list[str]]:
        return parse_qs(urlsplit(self.target).query)

    def arg(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[0] if values else None

    async def body(self, limit: int) -> bytes:
        try:
            length = int(self.headers.get("content-length", "0"))
        except ValueError:
            raise HttpError(HTTPStatus.BAD_REQUEST, "Content-Length must be an integer") from None
        if length < 0:
            raise HttpError(HTTPStatus.BAD_REQUEST, "Content-Length must not be negative")
        if length > limit:
            raise HttpError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body over {limit} bytes")
        return await self.reader.readexactly(length) if length else b""


async def read_request(reader: asyncio.StreamReader) -> Request:
    """The request line and headers. Raises ValueError (or asyncio's read errors) on a malformed head."""
    async with asyncio.timeout(HEAD_TIMEOUT_S):
        head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, target, _version = lines[0].split(" ", 2)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    return Request(method.upper(), target, headers, reader)


def head_bytes(status: int, content_type: str, length: int | None, extra: dict[str, str] | None = None) -> bytes:
    lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}", f"Content-Type: {content_type}"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    lines += [f"{k}: {v}" for k, v in (extra or {}).items()]
    lines += ["Cache-Control: no-store", "X-Content-Type-Options: nosniff", "Connection: close"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def respond(
    writer: asyncio.StreamWriter,
    status: int,
    body: bytes,
    content_type: str = "application/json",
    extra: dict[str, str] | None = None,
) -> None:
    writer.write(head_bytes(status, content_type, len(body), extra) + body)
    await writer.drain()


async def respond_json(writer: asyncio.StreamWriter, status: int, body: Any) -> None:
    await respond(writer, status, json.dumps(body).encode())
