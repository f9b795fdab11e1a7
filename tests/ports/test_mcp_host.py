"""The loopback `host` MCP server, spoken to over real HTTP (the provider-side view of host tools)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import anyio
import pytest
from agent_lab.testing.ports import EchoHostTools

from driver.ports.mcp_host import McpHostServer
from driver.protocol.boot import HostTool

TOOLS = [HostTool(name="lookup_order", description="Look up an order", input_schema={"type": "object"})]


def _post(server: McpHostServer, message: Any, token: str | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(
        server.url,
        data=json.dumps(message).encode(),
        method="POST",
        headers={
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "Authorization": f"Bearer {token if token is not None else server.token}",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            body = answer.read()
            return answer.status, json.loads(body) if body else None
    except urllib.error.HTTPError as exc:
        return exc.code, None


async def test_initialize_list_and_call() -> None:
    port = EchoHostTools()
    server = McpHostServer(TOOLS, port)
    await server.start()
    try:
        with anyio.fail_after(10):
            status, init = await anyio.to_thread.run_sync(
                _post,
                server,
                {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-03-26"}},
            )
            assert status == 200 and init["result"]["protocolVersion"] == "2025-03-26"
            assert init["result"]["serverInfo"]["name"] == "host"
            status, _ = await anyio.to_thread.run_sync(
                _post, server, {"jsonrpc": "2.0", "method": "notifications/initialized"}
            )
            assert status == 202
            _, listed = await anyio.to_thread.run_sync(
                _post, server, {"jsonrpc": "2.0", "id": "a", "method": "tools/list"}
            )
            assert listed["id"] == "a"
            assert listed["result"]["tools"] == [
                {"name": "lookup_order", "description": "Look up an order", "inputSchema": {"type": "object"}}
            ]
            call = {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "tools/call",
                "params": {"name": "lookup_order", "arguments": {"id": "7"}},
            }
            _, called = await anyio.to_thread.run_sync(_post, server, call)
            assert called["result"] == {"content": [{"type": "text", "text": "lookup_order ok"}], "isError": False}
            assert port.calls == [("lookup_order", {"id": "7"})]
            unknown = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "rm_rf"}}
            _, refused = await anyio.to_thread.run_sync(_post, server, unknown)
            assert refused["error"]["code"] == -32602 and port.calls == [("lookup_order", {"id": "7"})]
    finally:
        await server.close()


async def test_requires_the_token_and_closes() -> None:
    server = McpHostServer(TOOLS, EchoHostTools())
    await server.start()
    try:
        with anyio.fail_after(10):
            status, _ = await anyio.to_thread.run_sync(
                _post, server, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, "wrong-token"
            )
        assert status == 401
    finally:
        await server.close()
    with pytest.raises(OSError):
        await anyio.to_thread.run_sync(_post, server, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"})


async def test_a_successor_serves_the_same_address_and_token_or_says_the_port_is_taken() -> None:
    """PROTOCOL §8.2: a continued provider keeps calling the dead driver's server address with its token."""
    listed = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    first = McpHostServer(TOOLS, EchoHostTools())
    await first.start()
    address, token = first.port_number, first.token
    await first.close()
    second = McpHostServer(TOOLS, EchoHostTools(), token=token)
    await second.start(address)
    try:
        assert (second.port_number, second.token) == (address, token)
        with anyio.fail_after(10):
            status, answer = await anyio.to_thread.run_sync(_post, second, listed, token)
        assert status == 200 and answer["result"]["tools"][0]["name"] == "lookup_order"
        # The address is in use (by the second server): a third gets an ephemeral port instead of failing.
        third = McpHostServer(TOOLS, EchoHostTools(), token=token)
        await third.start(address)
        try:
            assert third.port_number not in (0, address)
        finally:
            await third.close()
    finally:
        await second.close()
