"""PROTOCOL §6.3 through the real driver process and the REAL Claude Code CLI: a host tool call the
control plane never answers ends at `host_tool_timeout_ms` with an error result to the provider (the run
goes on), a cancelled run resolves its open call `cancelled`, and each call has exactly one
`host_tool.resolved`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import INSTANCE, control_plane
from tests.kernel import runtimes
from tests.kernel.runtimes import Fakes
from tests.kernel.support import Driver, wait_terminal

pytestmark = pytest.mark.provider

SCHEMA = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
CALL = '[[tool:mcp__host__lookup:{"q": "teal"}]]'


def with_host_tool(payload: dict[str, Any], timeout_ms: int) -> dict[str, Any]:
    payload["execution"]["host_tools"] = [{"name": "lookup", "description": "Look a thing up", "input_schema": SCHEMA}]
    payload["execution"]["host_tool_timeout_ms"] = timeout_ms
    payload["execution"]["permission_policy"] = "full_access"
    return payload


def resolved(cp: Any) -> list[dict[str, Any]]:
    return [e["payload"] for e in cp.events(INSTANCE) if e["kind"] == "host_tool.resolved"]


async def test_unanswered_host_tool_times_out_and_the_run_goes_on(tmp_path: Path, fakes: Fakes) -> None:
    async with control_plane(tmp_path) as cp:
        payload = with_host_tool(runtimes.payload("claude-agent-sdk", tmp_path, cp.url, fakes), 1500)
        d = Driver(tmp_path, payload)
        try:
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": CALL})
            called = await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "host_tool.called", timeout=60)
            status = await cp.wait_for_command_status(cid, timeout=60)
            assert status["status"] == "completed", status
            call_id = called["payload"]["call_id"]
            assert resolved(cp) == [{"call_id": call_id, "outcome": "timed_out"}]
            # The provider got an error result (the fake model sees it in its next request).
            assert "no result within" in str(fakes.anthropic.requests[-1]["messages"])
            # A late answer is refused: the call is over.
            late, _ = await cp.send_command(
                INSTANCE, "host_tool.result", call_id=call_id, content=[{"type": "text", "text": "x"}], is_error=False
            )
            refused = await cp.wait_for_command_status(late, timeout=10)
            assert refused["status"] == "failed" and refused["error"]["code"] == "host_tool.unknown_call"
        finally:
            d.close()


async def test_cancelled_run_resolves_its_open_host_tool_call(tmp_path: Path, fakes: Fakes) -> None:
    async with control_plane(tmp_path) as cp:
        payload = with_host_tool(runtimes.payload("claude-agent-sdk", tmp_path, cp.url, fakes), 600_000)
        d = Driver(tmp_path, payload)
        try:
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": CALL})
            called = await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "host_tool.called", timeout=60)
            await cp.send_command(INSTANCE, "turn.cancel", run_id="run-1", reason="test")
            assert (await cp.wait_for_command_status(cid, timeout=60))["status"] == "cancelled"
            assert (await wait_terminal(cp, "run-1"))["kind"] == "run.cancelled"
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "host_tool.resolved", timeout=20)
            assert resolved(cp) == [{"call_id": called["payload"]["call_id"], "outcome": "cancelled"}]
        finally:
            d.close()


async def test_a_call_open_when_the_driver_dies_is_resolved_by_the_next_process(tmp_path: Path, fakes: Fakes) -> None:
    """PROTOCOL §6.3's "exactly one host_tool.resolved" across a SIGKILL: the call's HTTP request died
    with the dead process's MCP server, so the next process resolves it `cancelled` (journaled open calls,
    driver/queue/asked.py) before the run's driver.restarted."""
    async with control_plane(tmp_path) as cp:
        payload = with_host_tool(runtimes.payload("claude-agent-sdk", tmp_path, cp.url, fakes), 600_000)
        d = Driver(tmp_path, payload)
        try:
            await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": CALL})
            called = await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "host_tool.called", timeout=60)
            d.kill()
            await cp.wait_disconnected(INSTANCE, timeout=10)
            d = Driver(tmp_path, payload, name="driver2")
            terminal = await wait_terminal(cp, "run-1")
            assert terminal["kind"] == "run.failed" and terminal["payload"]["error"]["code"] == "driver.restarted"
            assert resolved(cp) == [{"call_id": called["payload"]["call_id"], "outcome": "cancelled"}]
            kinds = [e["kind"] for e in cp.events(INSTANCE) if e["kind"] in ("host_tool.resolved", "run.failed")]
            assert kinds == ["host_tool.resolved", "run.failed"]
            # Settled for good: a third process resolves nothing again.
            stop, _ = await cp.send_command(INSTANCE, "session.stop", reason="done")
            assert (await cp.wait_for_command_status(stop, timeout=30))["status"] == "completed"
            assert await d.wait(30) == 0
            d = Driver(tmp_path, payload, name="driver3")
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started" and e["epoch"] == 3, timeout=60)
            assert len(resolved(cp)) == 1
        finally:
            d.close()
