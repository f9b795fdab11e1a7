"""The provider liveness rule (PROTOCOL §8): the pure rule with an injected clock, then the real driver
process with our stubborn ACP agent blocking without CPU (failed, provider replaced) and computing
silently (never failed, over a window several times the limit)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from driver.telemetry.liveness import SilenceRule
from tests.integration.harness import INSTANCE, control_plane
from tests.kernel.support import Driver, terminals, wait_provider, wait_terminal
from tests.kernel.test_supervision import run, start

# -- the rule ---------------------------------------------------------------------------------------


def test_quiet_and_idle_for_the_whole_window_is_unresponsive() -> None:
    rule = SilenceRule(10.0, start=0.0, cpu_ms=500.0)
    assert not rule.observe(5.0, 520.0).unresponsive  # window not over yet
    verdict = rule.observe(10.0, 550.0)  # 50 ms in 10 s = 0.5 % of a core
    assert verdict.unresponsive and verdict.quiet_s == 10.0 and verdict.cpu_ms_in_window == 50.0


def test_cpu_above_one_percent_over_the_window_is_never_unresponsive() -> None:
    rule = SilenceRule(10.0, start=0.0, cpu_ms=0.0)
    cpu = 0.0
    for t in range(1, 60):
        cpu += 20.0  # 2 % of a core, no output at all
        assert not rule.observe(float(t), cpu).unresponsive
    # Then the work stops: the run is unresponsive once the window's average is 1 % or less.
    verdicts = [rule.observe(float(t), cpu).unresponsive for t in range(60, 75)]
    assert verdicts.index(True) == 4  # t = 64: the window [54, 64] holds 5 steps of 20 ms: 1 %, not more


def test_output_and_control_plane_waits_restart_the_window() -> None:
    rule = SilenceRule(10.0, start=0.0, cpu_ms=0.0)
    rule.progress(8.0)  # output at t = 8
    assert not rule.observe(12.0, 0.0).unresponsive
    assert rule.observe(18.0, 0.0).unresponsive
    rule.progress(18.0)  # e.g. a permission request pending at t = 18
    assert not rule.observe(19.0, 0.0).unresponsive


# -- the real driver ------------------------------------------------------------------------------


async def _heartbeat(cp: Any, predicate: Any, timeout: float = 10.0) -> dict[str, Any]:
    item: dict[str, Any] = await cp.wait_for(
        INSTANCE, lambda i: i.get("type") == "heartbeat" and predicate(i.get("activity") or {}), timeout=timeout
    )
    return item["activity"]  # type: ignore[no-any-return]


async def test_a_provider_blocked_without_cpu_fails_unresponsive_and_is_replaced(
    tmp_path: Path, drivers: list[Driver]
) -> None:
    async with control_plane(tmp_path) as cp:
        d = start(tmp_path, cp.url, drivers, env={"AGENT_DRIVER_PROVIDER_SILENCE_MS": "1500"})
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=20)
        first = await wait_provider(d)
        status = await run(cp, "run-hang", "[[hang]]")
        assert status["status"] == "failed" and status["error"]["code"] == "provider.unresponsive"
        (terminal,) = terminals(cp, "run-hang")
        error = terminal["payload"]["error"]
        assert error["code"] == "provider.unresponsive" and error["retryable"] is True
        assert error["details"]["quiet_s"] >= 1.5
        assert error["details"]["cpu_ms"] <= 15  # at most 1 % of one core over the window
        # The provider was replaced: a new process serves the next run.
        second = await wait_provider(d, exclude=(first,))
        assert second != first
        assert (await run(cp, "run-after", "[[say:back]]"))["status"] == "completed"


async def test_a_silent_tool_that_computes_is_never_failed(tmp_path: Path, drivers: list[Driver]) -> None:
    async with control_plane(tmp_path) as cp:
        d = start(tmp_path, cp.url, drivers, env={"AGENT_DRIVER_PROVIDER_SILENCE_MS": "1500"})
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=20)
        pid = await wait_provider(d)
        cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-busy", input={"text": "[[compute:6]]"})
        # While it computes, heartbeats show the tool call and CPU that keeps growing.
        busy = await _heartbeat(cp, lambda a: a.get("tool_call_id") and (a.get("tool_running_ms") or 0) > 1000)
        assert busy["provider_pid"] == pid and busy["provider_processes"] >= 1
        later = await _heartbeat(cp, lambda a: (a.get("tool_running_ms") or 0) > busy["tool_running_ms"] + 1000)
        # Busy: far above the rule's 1 % of a core (by a margin that holds on a loaded shared machine).
        elapsed_ms = later["tool_running_ms"] - busy["tool_running_ms"]
        assert later["provider_cpu_ms"] - busy["provider_cpu_ms"] > 0.05 * elapsed_ms
        assert later["last_provider_output_ms_ago"] > 1500  # silent for longer than the limit
        status = await cp.wait_for_command_status(cid, timeout=30)
        assert status["status"] == "completed"
        (terminal,) = terminals(cp, "run-busy")
        assert terminal["kind"] == "run.completed" and terminal["payload"]["final_message_text"] == "computed"
        await wait_terminal(cp, "run-busy")
