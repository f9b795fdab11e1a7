"""The `host` MCP server (PROTOCOL §6.3): `execution.host_tools` offered to a provider over loopback HTTP.

A provider that takes MCP servers by URL (Codex, ACP agents with http MCP) connects here; each
`tools/call` goes to the host-tools port, which announces it as `host_tool.called` and waits for the
control plane's `host_tool.result`. Transport: MCP "streamable HTTP" in its plain-JSON form (every POST
of a JSON-RPC request is answered with one `application/json` body; notifications get 202; the
optional server-to-client SSE stream is not offered, so GET answers 405).

Bound to 127.0.0.1 on an ephemeral port and guarded by a random bearer token, so other local processes
cannot call the control plane's tools. The token is handed to the provider in an environment variable.
It stands on the hardened loopback core (`driver.net.listener`): path, token and method are decided on the
request head before any body byte is read, and connections, bytes and every read are bounded.

Background work: `start()` serves on the event loop (the server lives as long as the provider
process, across adapter calls); `close()` ends it and every open connection.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Sequence
from typing import Any

import msgspec

from driver import logs
from driver.interfaces import HostToolPort
from driver.net.listener import Exchange, Handler, Head, Limits, LoopbackServer, Reply, json_values
from driver.protocol.boot import HostTool

log = logs.get(__name__)

SERVER_NAME = "host"
PROTOCOL_VERSION = "2025-06-18"
# A provider's MCP client keeps a connection or two; tool arguments are small. The core's deadlines
# hold for the head and body only: a tool call may wait on the control plane for as long as it takes.
LIMITS = Limits(
    max_connections=32, max_per_client=32, max_body_bytes=16 * 1024 * 1024, max_buffered_bytes=32 * 1024 * 1024
)
_JSON = [(b"content-type", b"application/json")]
# Values one JSON-RPC message may decode into: a tool's arguments are a small object; a body of
# 16 MiB of `{}`s (5.6 M objects, ~400 MiB once decoded) is refused before it is decoded.
MAX_VALUES = 100_000


def _json(status: int, payload: Any) -> Reply:
    if payload is None:
        return Reply(status)
    return Reply(status, msgspec.json.encode(payload), _JSON)


def _error_body(status: int, message: str, head: Head | None) -> bytes:
    return msgspec.json.encode({"error": message})


class McpHostServer:
    def __init__(self, tools: Sequence[HostTool], port: HostToolPort, token: str | None = None) -> None:
        self.tools = list(tools)
        self._port = port
        # A continued provider (PROTOCOL §8.2) presents the token its dead driver's server gave it.
        self.token = token or secrets.token_urlsafe(32)
        logs.add([self.token])  # handed to the provider in its environment: never in a log line
        self._server = LoopbackServer(self._decide, name="mcp_host", limits=LIMITS, error_body=_error_body)
        self.port_number = 0
        self.calls = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port_number}/mcp"

    async def start(self, port: int = 0) -> None:
        """Listen on 127.0.0.1:`port` (a reattach asks for the dead driver's, which the continued
        provider still calls), or on an ephemeral port when that one is taken or none is asked for."""
        try:
            self.port_number = self._server.bind(port)
        except OSError as exc:
            if not port:
                raise
            log.warning("mcp_host.port_taken", port=port, error=exc.strerror or type(exc).__name__)
            self.port_number = self._server.bind(0)
        await self._server.start()

    async def close(self) -> None:
        await self._server.close()

    # -- HTTP: decided on the head (path, token, method) before a body byte is read ---------------

    def _decide(self, head: Head) -> Reply | Handler:
        if head.target.split("?", 1)[0] != "/mcp":
            return _json(404, {"error": "not found"})
        presented = (head.header(b"authorization") or "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(presented.encode(), self.token.encode()):
            return _json(401, {"error": "unauthorized"})
        if head.method == "DELETE":
            return _json(200, None)
        if head.method != "POST":
            return _json(405, None)  # no server-initiated SSE stream
        return self._post

    async def _post(self, exchange: Exchange) -> None:
        body = await exchange.body()
        status, payload = await self._handle(body)
        await exchange.reply(_json(status, payload))

    # -- MCP ------------------------------------------------------------------------------------

    async def _handle(self, body: bytes) -> tuple[int, Any]:
        if json_values(body, MAX_VALUES) > MAX_VALUES:
            message = f"request too large: more than {MAX_VALUES} JSON values"
            return 400, {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": message}}
        try:
            message = msgspec.json.decode(body)
        except (msgspec.DecodeError, RecursionError):  # RecursionError: nested ~1000 levels deep
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
