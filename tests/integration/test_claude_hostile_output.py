"""The Claude CLI's output, as the agent can shape it, through the real driver and the real CLI.

The model is part of the agent (THREATS.md): what it asks a tool to run comes back in the CLI's
stream-json as that tool call's `input`, a JSON value of any shape. A tool input nested past the
decoder's depth (msgspec, like Python's json, raises RecursionError there, not a DecodeError) must be
one skipped line (`provider.protocol`), never the end of the driver's link to the CLI.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from agent_lab.testing.fakes import Fakes

from tests.integration.harness import INSTANCE, DriverProcess, control_plane
from tests.integration.test_model_proxy import end_tree
from tests.kernel.runtimes import payload as runtime_payload

# Past the decoder's depth (~1000 levels less the reader's stack).
DEPTH = 1500


@pytest.fixture(scope="module")
def fakes() -> Iterator[Fakes]:
    with ExitStack() as stack:
        yield Fakes(stack)


@pytest.fixture
def deep_recursion() -> Iterator[None]:
    """The fake model (in this process) must parse and send the deep input a real model can write."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)
    yield
    sys.setrecursionlimit(limit)


@pytest.mark.provider
@pytest.mark.usefixtures("deep_recursion")
async def test_a_deeply_nested_tool_input_does_not_end_the_cli_link(tmp_path: Path, fakes: Fakes) -> None:
    driver: DriverProcess | None = None
    try:
        async with control_plane(tmp_path) as cp:
            payload = runtime_payload("claude-agent-sdk", tmp_path, cp.url, fakes)
            payload["execution"]["permission_policy"] = "full_access"
            driver = DriverProcess(tmp_path, payload)
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=90)
            deep = '{"a":' * DEPTH + "1" + "}" * DEPTH
            cid, _ = await cp.send_command(
                INSTANCE, "input.start", run_id="run-1", input={"text": f"[[tool:Nope:{deep}]]"}
            )
            first = await cp.wait_for_command_status(cid, timeout=120)
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-2", input={"text": "[[say:after]]"})
            second = await cp.wait_for_command_status(cid, timeout=120)
            assert first["status"] == "completed", json.dumps({k: v for k, v in first.items() if k != "body"})[:3000]
            assert second["status"] == "completed", json.dumps(second)[:2000]
            said = [e["payload"] for e in cp.events(INSTANCE, "message.completed") if e["run_id"] == "run-2"]
            assert any("after" in json.dumps(p) for p in said), said
            reported = json.dumps([e["payload"] for e in cp.events(INSTANCE, "diagnostic.reported")])
            assert "nested too deep" in reported, reported[:2000]
            assert driver.proc.poll() is None
    finally:
        end_tree(driver)
