"""The host MCP server an adapter starts (PROTOCOL §6.3), and its address across a reattach (§8.2).

A provider calls the `host` server at the URL and with the bearer token it was started with, and a
continued provider keeps both after its driver dies. So with `reattach_grace_ms > 0`, the address and
token of the server a kept provider was started with are recorded in `state_dir/driver/keeper/host.json`
(MAC'd like the keeper's other files, hidden from the provider's tree: §9), and the next driver's server
listens on that address and accepts that token. When the port has been taken meanwhile the server
listens elsewhere and the continued provider's host tool calls fail (a fresh provider gets the new URL).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from driver import logs
from driver.adapters.common.base import AdapterConfig
from driver.interfaces import HostToolPort
from driver.keeper import state as keeper_state
from driver.ports.mcp_host import McpHostServer

log = logs.get(__name__)

# The variable the provider reads the host MCP server\'s bearer token from (its config names it, never the value).
HOST_TOKEN_ENV = "AGENT_DRIVER_HOST_MCP_TOKEN"

FILE = "host.json"


def _path(state_dir: Path) -> Path:
    return keeper_state.keeper_dir(state_dir) / FILE


async def start(config: AdapterConfig, port: HostToolPort) -> McpHostServer:
    """The running server: on the recorded address and token when reattach is on and a record checks."""
    saved: tuple[int, str] | None = None
    if config.execution.reattach_grace_ms > 0:
        saved = _read(Path(config.session.state_dir))
    server = McpHostServer(config.execution.host_tools, port, token=saved[1] if saved else None)
    await server.start(saved[0] if saved else 0)
    if saved is not None and server.port_number != saved[0]:
        log.warning("mcp_host.address_changed", port=server.port_number, recorded=saved[0])
    return server


def remember(state_dir: Path, server: McpHostServer | None) -> None:
    """A provider was just started under a keeper with `server` (or none): record its address."""
    path = _path(state_dir)
    if server is None:
        with contextlib.suppress(OSError):
            path.unlink()
        return
    keeper_state.write_json(path, {"port": server.port_number, "token": server.token})


def _read(state_dir: Path) -> tuple[int, str] | None:
    try:
        raw = keeper_state.read_json(_path(state_dir))
        port, token = raw["port"], raw["token"]
    except (TypeError, KeyError):
        return None
    if not (isinstance(port, int) and 0 < port < 65536 and isinstance(token, str) and len(token) >= 32):
        return None
    return port, token
