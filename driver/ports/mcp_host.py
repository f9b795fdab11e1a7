"""The `host` MCP server (PROTOCOL §6.3): `execution.host_tools` offered to a provider over loopback HTTP.

A provider that takes MCP servers by URL (Codex, ACP agents with http MCP) connects here; each
`tools/call` goes to the host-tools port, which announces it as `host_tool.called` and waits for the
control plane's `host_tool.result`. Transport: MCP "streamable HTTP" in its plain-JSON form (every POST
of a JSON-RPC request is answered with one `application/json` body; notifications get 202; the
optional server-to-client SSE stream is not offered, so GET answers 405).

Bound to 127.0.0.1 on an ephemeral port and guarded by a random bearer token, so other local processes
cannot call the control plane's tools. The token is handed to the provider in an environment variable.

Background work: `start()` runs the accept loop as a task on the event loop (the server lives as long
as the provider process, across adapter calls); `close()` ends it and every open connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import secrets
from collections.abc import Sequence
from typing import Any

import anyio
import anyio.abc
import msgspec

from driver import logs
from driver.interfaces import HostToolPort
from driver.protocol.boot import HostTool

log = logs.get(__name__)

SERVER_NAME = "host"
PROTOCOL_VERSION = "2025-06-18"
_MAX_HEADER_BYTES = 64 * 1024
_MAX_BODY_BYTES = 16 * 1024 * 1024
_REASONS = {
    200: "OK",
    202: "Accepted",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    413: "Payload Too Large",
}


class _BadRequest(Exception):
    pass


class McpHostServer:
    def __init__(self, tools: Sequence[HostTool], port: HostToolPort, token: str | None = None) -> None:
        self.tools = list(tools)
        self._port = port
        # A continued provider (PROTOCOL §8.2) presents the token its dead driver's server gave it.
        self.token = token or secrets.token_urlsafe(32)
        logs.add([self.token])  # handed to the provider in its environment: never in a log line
        self._listener: anyio.abc.Listener[anyio.abc.SocketStream] | None = None
        self._task: asyncio.Task[None] | None = None
        self.port_number = 0
        self.calls = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port_number}/mcp"

    async def start(self, port: int = 0) -> None:
        """Listen on 127.0.0.1:`port` (a reattach asks for the dead driver's, which the continued
        provider still calls), or on an ephemeral port when that one is taken or none is asked for."""
        try:
            listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=port)
        except OSError as exc:
            if not port:
                raise
            log.warning("mcp_host.port_taken", port=port, error=exc.strerror or type(exc).__name__)
            listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        self._listener = listener
        self.port_number = int(listener.extra(anyio.abc.SocketAttribute.local_port))
        self._task = asyncio.get_running_loop().create_task(self._serve(listener), name="mcp-host")

    async def _serve(self, listener: anyio.abc.Listener[anyio.abc.SocketStream]) -> None:
        with contextlib.suppress(anyio.ClosedResourceError):
            await listener.serve(self._connection)

    async def close(self) -> None:
        listener, self._listener = self._listener, None
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if listener is not None:
            with contextlib.suppress(Exception):
                await listener.aclose()

    # -- HTTP/1.1, just enough ------------------------------------------------------------------

    async def _connection(self, stream: anyio.abc.SocketStream) -> None:
        buffer = bytearray()
        async with stream:
            try:
                while True:
                    request = await self._read_request(stream, buffer)
                    if request is None:
                        return
                    method, path, headers, body = request
                    status, payload = await self._handle(method, path, headers, body)
                    await self._respond(stream, status, payload)
                    if headers.get("connection", "").lower() == "close":
                        return
            except _BadRequest as exc:
                await self._respond(stream, 400, {"error": str(exc)})
            except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                return

    @staticmethod
    async def _read_request(
        stream: anyio.abc.SocketStream, buffer: bytearray
    ) -> tuple[str, str, dict[str, str], bytes] | None:
        while b"\r\n\r\n" not in buffer:
            if len(buffer) > _MAX_HEADER_BYTES:
                raise _BadRequest("headers too large")
            try:
                buffer += await stream.receive()
            except anyio.EndOfStream:
                return None
        head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3:
            raise _BadRequest("bad request line")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        if "chunked" in headers.get("transfer-encoding", "").lower():
            raise _BadRequest("chunked request bodies are not supported")
        length = int(headers.get("content-length") or 0)
        if length > _MAX_BODY_BYTES:
            raise _BadRequest("body too large")
        while len(rest) < length:
            rest += await stream.receive()
        buffer[:] = rest[length:]
        return parts[0], parts[1], headers, rest[:length]

    @staticmethod
    async def _respond(stream: anyio.abc.SocketStream, status: int, payload: Any) -> None:
        body = b"" if payload is None else msgspec.json.encode(payload)
        head = [f"HTTP/1.1 {status} {_REASONS.get(status, 'OK')}", f"Content-Length: {len(body)}"]
        if body:
            head.append("Content-Type: application/json")
        await stream.send(("\r\n".join(head) + "\r\n\r\n").encode() + body)

    # -- MCP ------------------------------------------------------------------------------------

    async def _handle(self, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, Any]:
        if path.split("?", 1)[0] != "/mcp":
            return 404, {"error": "not found"}
        presented = headers.get("authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(presented.encode(), self.token.encode()):
            return 401, {"error": "unauthorized"}
        if method == "DELETE":
            return 200, None
        if method != "POST":
            return 405, None  # no server-initiated SSE stream
        try:
            message = msgspec.json.decode(body)
        except msgspec.DecodeError:
            return 400, {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "parse error"}}
        if not isinstance(message, dict) or not isinstance(message.get("method"), str):
            return 202, None  # a response or a batch of them: nothing to answer
        if "id" not in message:
            return 202, None  # a notification (initialized, cancelled)
        reply: dict[str, Any] = {"jsonrpc": "2.0", "id": message["id"]}
        try:
            reply["result"] = await self._dispatch(message["method"], message.get("params") or {})
        except _RpcError as exc:
            reply["error"] = {"code": exc.code, "message": exc.message}
        return 200, reply

    async def _dispatch(self, method: str, params: Any) -> Any:
        if method == "initialize":
            version = params.get("protocolVersion") if isinstance(params, dict) else None
            return {
                "protocolVersion": version if isinstance(version, str) else PROTOCOL_VERSION,
                "capabilities": {"tools": {"listChanged": False}},
                "serverInfo": {"name": SERVER_NAME, "version": "0.1.0"},
            }
        if method == "ping":
            return {}
        if method == "tools/list":
            return {
                "tools": [
                    {"name": t.name, "description": t.description, "inputSchema": t.input_schema} for t in self.tools
                ]
            }
        if method == "tools/call":
            if not isinstance(params, dict) or not isinstance(params.get("name"), str):
                raise _RpcError(-32602, "tools/call needs a tool name")
            name = params["name"]
            if name not in {t.name for t in self.tools}:
                raise _RpcError(-32602, f"unknown tool: {name}")
            self.calls += 1
            reply = await self._port.call(name, params.get("arguments") or {})
            return {"content": reply.content, "isError": reply.is_error}
        raise _RpcError(-32601, f"method not found: {method}")


class _RpcError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
