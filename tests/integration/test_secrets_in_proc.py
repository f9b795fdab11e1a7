"""No secret in any process's argv, and the control token in no process's environment either
(issue 11): the real driver runs the real Claude CLI with an authenticated HTTP MCP server, a stdio MCP
server with a secret in its `env`, a provider key and the control token, and every process of its tree
is read through /proc while an MCP tool call is in progress. The same with Codex app-server."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import anyio
import pytest

from driver.interfaces import HostToolReply
from driver.ports.mcp_host import McpHostServer
from driver.protocol.boot import HostTool
from tests.integration.harness import INSTANCE, ROOT, TOKEN, DriverProcess, control_plane
from tests.kernel.runtimes import Fakes
from tests.kernel.runtimes import payload as runtime_payload

PROVIDER_KEY = "sk-ant-PROVIDER-KEY-0123456789"
STDIO_SECRET = "stdio-env-SECRET-4711"


class HeldTool:
    """The HTTP MCP server's tool: it holds the call until the test has scanned /proc."""

    def __init__(self) -> None:
        self.called = anyio.Event()
        self.release = anyio.Event()

    async def call(self, name: str, arguments: Any) -> HostToolReply:
        self.called.set()
        await self.release.wait()
        return HostToolReply([{"type": "text", "text": f"{name} ok"}], False)


def process_tree(root: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                # The command name may contain spaces and parentheses: the ppid follows the last ')'.
                parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    tree, frontier = [root], [root]
    while frontier:
        frontier = [pid for pid, ppid in parents.items() if ppid in frontier]
        tree.extend(frontier)
    return tree


def read_proc(pid: int, name: str) -> bytes:
    try:
        with open(f"/proc/{pid}/{name}", "rb") as f:
            return f.read()
    except OSError:
        return b""  # exited meanwhile


@pytest.fixture(scope="module")
def fakes() -> Iterator[Fakes]:
    with ExitStack() as stack:
        yield Fakes(stack)


# The prompt per runtime: an MCP tool call, scanned mid-call. codex-acp did not call the HTTP server's
# tool from the fake's marker within 60 s (not investigated), so it answers a plain prompt and is
# scanned after it: its stdio MCP server is up by then (asserted below), the HTTP one configured.
TOOL_CALL = {
    "claude-agent-sdk": '[[tool:mcp__docs__search_docs:{"q": "x"}]]',
    "openai-app-server": '[[mcp:docs:search_docs:{"q": "x"}]]',
    "acp:codex-acp": "[[say:hi]]",
}
PROVIDER_KEYS = ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "FAKE_OPENAI_API_KEY")


@pytest.mark.provider
@pytest.mark.parametrize("runtime", sorted(TOOL_CALL))
async def test_no_secret_in_argv_and_no_token_in_any_environment(tmp_path: Path, fakes: Fakes, runtime: str) -> None:
    held = HeldTool()
    docs = McpHostServer([HostTool(name="search_docs", description="Search the docs")], held)
    await docs.start()
    header_value = f"Bearer {docs.token}"
    driver: DriverProcess | None = None
    try:
        async with control_plane(tmp_path) as cp:
            payload = runtime_payload(runtime, tmp_path, cp.url, fakes)
            execution = payload["execution"]
            execution["permission_policy"] = "full_access"
            env = execution["environment"]
            for key in PROVIDER_KEYS:
                if key in env:
                    env[key] = PROVIDER_KEY
            env["DOCS_AUTH"] = header_value
            execution["mcp_servers"] = [
                {
                    "name": "docs",
                    "transport": "http",
                    "url": docs.url,
                    "headers_from_env": {"Authorization": "DOCS_AUTH"},
                },
                {
                    "name": "envsrv",
                    "transport": "stdio",
                    "command": [sys.executable, str(ROOT / "tests" / "helpers" / "env_mcp_server.py"), "K"],
                    "env": {"K": STDIO_SECRET},
                },
            ]
            driver = DriverProcess(tmp_path, payload)
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=60)
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": TOOL_CALL[runtime]})
            if runtime == "acp:codex-acp":
                assert (await cp.wait_for_command_status(cid, timeout=60))["status"] == "completed"
            else:
                with anyio.fail_after(60):
                    await held.called.wait()
            # Mid-call: the driver, the CLI and both MCP servers' connections are up.
            tree = process_tree(driver.pid)
            argv = {pid: read_proc(pid, "cmdline") for pid in tree}
            environ = {pid: read_proc(pid, "environ") for pid in tree}
            held.release.set()
            assert len(tree) >= 3, tree  # the driver, the CLI, the stdio MCP server at least
            assert any(b"env_mcp_server.py" in a for a in argv.values())  # the stdio server is in the tree
            assert any(PROVIDER_KEY.encode() in e for e in environ.values())  # the provider key is set
            secrets = {
                "control token": TOKEN,
                "mcp header": header_value,
                "mcp token": docs.token,
                "provider key": PROVIDER_KEY,
                "stdio env": STDIO_SECRET,
            }
            for label, secret in secrets.items():
                leaks = [pid for pid, a in argv.items() if secret.encode() in a]
                assert leaks == [], f"the {label} is in the argv of {leaks}"
            leaks = [pid for pid, e in environ.items() if TOKEN.encode() in e]
            assert leaks == [], f"the control token is in the environment of {leaks}"
            status = await cp.wait_for_command_status(cid, timeout=60)
            assert status["status"] == "completed", json.dumps(status)
            assert TOKEN not in driver.stderr()
    finally:
        if driver is not None:
            # Providers run in their own process groups: end the whole tree, not only the driver's group.
            leftovers = process_tree(driver.pid)[1:]
            driver.close()
            for pid in leftovers:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        await docs.close()
