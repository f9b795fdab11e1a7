"""Observability with each REAL runtime (Claude Code CLI, Codex app-server, codex-acp) against the
fake model endpoints, through the real driver process: heartbeat activity of the real provider tree,
the phase timings, and a traced run (the runtime accepts the run's trace context in its own field:
Codex `trace`, ACP `_meta`) whose span is the given traceparent's child."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from agent_lab.testing.otlp_receiver import OtlpReceiver

from tests.integration.harness import INSTANCE, control_plane
from tests.kernel import runtimes
from tests.kernel.runtimes import RUNTIMES, Fakes
from tests.kernel.support import Driver, wait_provider

RUN_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
RUN_SPAN = "00f067aa0ba902b7"


@pytest.fixture
def otlp() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as receiver:
        yield receiver


@pytest.mark.provider
@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_activity_timings_and_a_traced_run(
    tmp_path: Path, drivers: list[Driver], fakes: Fakes, otlp: OtlpReceiver, runtime: str
) -> None:
    async with control_plane(tmp_path) as cp:
        payload = runtimes.payload(runtime, tmp_path, cp.url, fakes)
        payload["telemetry"] = {"otlp_endpoint": otlp.base_url}
        d = Driver(tmp_path, payload)
        drivers.append(d)
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=90)
        pid = await wait_provider(d)
        beat: dict[str, Any] = await cp.wait_for(
            INSTANCE, lambda i: i.get("type") == "heartbeat" and (i.get("activity") or {}).get("provider_pid"), 10
        )
        activity = beat["activity"]
        assert activity["provider_pid"] == pid and activity["provider_processes"] >= 1
        assert activity["provider_rss_mb"] > 10 and activity["provider_cpu_ms"] > 0  # a real runtime started
        cid, _ = await cp.send_command(
            INSTANCE,
            "input.start",
            run_id="run-traced",
            input={"text": "[[say:traced reply]]"},
            traceparent=f"00-{RUN_TRACE}-{RUN_SPAN}-01",
        )
        status = await cp.wait_for_command_status(cid, timeout=90)
        assert status["status"] == "completed", status
        run_span = await anyio.to_thread.run_sync(
            lambda: otlp.wait_for(lambda s: s.name == "agent_driver.run", timeout=20)
        )
        assert (run_span.trace_id, run_span.parent_span_id) == (RUN_TRACE, RUN_SPAN) and run_span.status_code != 2
        token = await cp.wait_for_event(
            INSTANCE,
            lambda e: e["kind"] == "runtime.timing.recorded" and e["payload"]["phase"] == "first_token",
            timeout=20,
        )
        assert token["payload"]["run_id"] == "run-traced" and token["payload"]["mode"] == "cold"
        phases = {e["payload"]["phase"] for e in cp.events(INSTANCE, kinds="runtime.timing.recorded")}
        assert {"hello", "provider.spawn", "provider.ready", "first_token"} <= phases
        assert phases & {"session.open", "session.resume"}
        if runtime == "claude-agent-sdk":
            # Claude Code exports its own spans too; with no per-turn field they join the session's
            # trace, under the session span its TRACEPARENT named (the parent of our provider start).
            start = await anyio.to_thread.run_sync(
                lambda: otlp.wait_for(lambda s: s.name == "agent_driver.provider.start", timeout=20)
            )
            claude = await anyio.to_thread.run_sync(
                lambda: otlp.wait_for(lambda s: s.resource.get("service.name") == "claude-code", timeout=30)
            )
            assert claude.trace_id == start.trace_id and claude.name.startswith("claude_code.")
        if runtime == "openai-app-server":
            # Codex exports its own spans to the same collector, under the run span (its `trace` field).
            codex_span = await anyio.to_thread.run_sync(
                lambda: otlp.wait_for(lambda s: s.parent_span_id == run_span.span_id, timeout=20)
            )
            assert codex_span.trace_id == RUN_TRACE and codex_span.resource.get("service.name") != "agent-driver"


@pytest.mark.provider
async def test_a_host_tool_call_is_a_span_of_its_run(
    tmp_path: Path, drivers: list[Driver], fakes: Fakes, otlp: OtlpReceiver
) -> None:
    async with control_plane(tmp_path) as cp:
        payload = runtimes.payload("claude-agent-sdk", tmp_path, cp.url, fakes)
        payload["telemetry"] = {"otlp_endpoint": otlp.base_url}
        payload["execution"]["permission_policy"] = "full_access"
        payload["execution"]["host_tools"] = [
            {
                "name": "lookup",
                "description": "Look a thing up",
                "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
            }
        ]
        d = Driver(tmp_path, payload)
        drivers.append(d)
        cid, _ = await cp.send_command(
            INSTANCE, "input.start", run_id="run-host", input={"text": '[[tool:mcp__host__lookup:{"q": "teal"}]]'}
        )
        called = await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "host_tool.called", timeout=90)
        await cp.send_command(
            INSTANCE,
            "host_tool.result",
            call_id=called["payload"]["call_id"],
            content=[{"type": "text", "text": "teal is a colour"}],
            is_error=False,
        )
        assert (await cp.wait_for_command_status(cid, timeout=90))["status"] == "completed"
        call = await anyio.to_thread.run_sync(
            lambda: otlp.wait_for(lambda s: s.name == "agent_driver.host_tool.call", timeout=20)
        )
        run_span = await anyio.to_thread.run_sync(
            lambda: otlp.wait_for(lambda s: s.name == "agent_driver.run", timeout=20)
        )
        assert call.parent_span_id == run_span.span_id and call.trace_id == run_span.trace_id
        assert call.attributes["tool.name"] == "lookup" and call.status_code != 2
