"""Provider supervision through the real driver process: a crash mid-run, a death while idle, a crash
loop, a start that never finishes, a provider that goes silent; session.stop and signals. Plus the
pure policy (crash window, backoff, bounds from the environment) with an injected clock.

The provider is our stubborn ACP agent in its misbehaving modes (agent_lab/testing/agents/stubborn_acp_agent.py).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from driver.kernel.options import KernelOptions
from driver.kernel.supervision import CrashWindow, EnvOptionError, options_from_env
from tests.integration.harness import INSTANCE, TOKEN, boot_payload, control_plane
from tests.kernel import runtimes
from tests.kernel.runtimes import RUNTIMES, Fakes
from tests.kernel.support import (
    Driver,
    children,
    now,
    terminals,
    wait_diagnostic,
    wait_group_gone,
    wait_provider,
    wait_terminal,
)

FAST = {
    "AGENT_DRIVER_CANCEL_GRACE_MS": "400",
    "AGENT_DRIVER_TERM_GRACE_MS": "400",
    "AGENT_DRIVER_RESTART_BACKOFF_MS": "20",
    "AGENT_DRIVER_RESTART_BACKOFF_CAP_MS": "100",
}


def start(
    tmp: Path,
    url: str,
    drivers: list[Driver],
    *,
    env: dict[str, str] | None = None,
    agent_env: dict[str, str] | None = None,
    **kw: Any,
) -> Driver:
    payload = boot_payload(tmp, url, **kw)
    if agent_env:
        payload["execution"]["acp"]["env"] = agent_env
    d = Driver(tmp, payload, env={**FAST, **(env or {})})
    drivers.append(d)
    return d


async def run(cp: Any, run_id: str, text: str, timeout: float = 30) -> dict[str, Any]:
    cid, _ = await cp.send_command(INSTANCE, "input.start", run_id=run_id, input={"text": text})
    status: dict[str, Any] = await cp.wait_for_command_status(cid, timeout=timeout)
    return status


# -- the policy, without processes -------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_crash_window_backs_off_trips_and_clears() -> None:
    clock = Clock()
    w = CrashWindow(limit=5, window_s=600, backoff_base_s=1, backoff_cap_s=4, clock=clock)
    delays = []
    for _ in range(4):
        delays.append(w.record())
        clock.t += 1
    assert delays == [0.0, 1.0, 2.0, 4.0]  # the first restart is immediate; then doubling, capped
    assert not w.tripped
    assert w.record() == 4.0 and w.tripped and w.count == 5
    assert w.started() is True and not w.tripped  # a successful start clears the loop...
    assert w.started() is False
    w.record()  # ...but keeps the history: one more crash inside the window trips it again
    assert w.tripped
    clock.t += 601  # the window slides: old crashes no longer count
    assert w.count == 0
    w.started()
    assert w.record() == 0.0 and not w.tripped


def test_bounds_from_environment() -> None:
    opts = KernelOptions.from_env(
        {"AGENT_DRIVER_CANCEL_GRACE_MS": "250", "AGENT_DRIVER_TERM_GRACE_MS": "0", "AGENT_DRIVER_CRASH_LOOP_LIMIT": "3"}
    )
    assert opts.cancel_interrupt_grace_s == 0.25 and opts.cancel_term_grace_s == 0.0
    assert opts.crash_loop_limit == 3
    assert opts.provider_start_timeout_s == 60.0  # untouched defaults stay
    defaults = KernelOptions.from_env({})
    assert (defaults.cancel_interrupt_grace_s, defaults.cancel_term_grace_s) == (5.0, 3.0)
    # The outbox's two bounds are set apart: raising the event bound leaves the byte bound as it was.
    assert (defaults.outbox_max_events, defaults.outbox_max_bytes) == (100_000, 256 << 20)
    raised = KernelOptions.from_env({"AGENT_DRIVER_OUTBOX_MAX_EVENTS": "1000000"})
    assert (raised.outbox_max_events, raised.outbox_max_bytes) == (1_000_000, 256 << 20)
    both = KernelOptions.from_env({"AGENT_DRIVER_OUTBOX_MAX_BYTES": str(1 << 30)})
    assert both.outbox_max_bytes == 1 << 30
    for bad in ("-1", "soon", "inf", "nan"):
        with pytest.raises(EnvOptionError, match="AGENT_DRIVER_CANCEL_GRACE_MS"):
            options_from_env({"AGENT_DRIVER_CANCEL_GRACE_MS": bad})
    with pytest.raises(EnvOptionError, match="positive integer"):
        options_from_env({"AGENT_DRIVER_CRASH_LOOP_LIMIT": "0"})


# -- crashes ------------------------------------------------------------------------------------------


async def test_crash_mid_run_fails_the_run_with_stderr_tail_then_restarts(
    tmp_path: Path, drivers: list[Driver]
) -> None:
    async with control_plane(tmp_path) as cp:
        d = start(tmp_path, cp.url, drivers, mode="exit-mid-turn")
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=20)
        first = await wait_provider(d)
        status = await run(cp, "run-1", "hello")
        assert status["status"] == "failed"
        assert status["error"]["code"] == "provider.crashed" and status["error"]["retryable"] is True
        [terminal] = terminals(cp, "run-1")
        assert terminal["kind"] == "run.failed"
        error = terminal["payload"]["error"]
        assert error["code"] == "provider.crashed"
        assert "exiting mid-turn on purpose" in error["details"]["stderr_tail"]
        restarting = await wait_diagnostic(cp, "provider.restarting")
        assert restarting["payload"]["details"]["crashed"] is True
        await wait_diagnostic(cp, "provider.restarted")
        await wait_group_gone(first)
        assert await wait_provider(d) != first


async def test_provider_dying_while_idle_is_noticed_and_restarted(tmp_path: Path, drivers: list[Driver]) -> None:
    budget = tmp_path / "crashes"
    budget.write_text("1")
    async with control_plane(tmp_path) as cp:
        start(tmp_path, cp.url, drivers, mode="crash-after-init", agent_env={"STUBBORN_CRASHES": str(budget)})
        exited = await wait_diagnostic(cp, "provider.exited")
        tail = exited["payload"]["details"]["stderr_tail"]
        assert "crashing after init on purpose" in tail
        assert "provider-secret-777" not in tail and "FAKE_PROVIDER_KEY=[redacted]" in tail
        assert exited["run_id"] is None
        restarted = await wait_diagnostic(cp, "provider.restarted", after_seq=exited["seq"])
        assert restarted["payload"]["details"]["reason"] == "the provider exited"
        assert budget.read_text() == "0"
        status = await run(cp, "run-1", "[[say:after the restart]]")
        assert status["status"] == "completed"


async def test_crash_loop_trips_fails_inputs_fast_and_recovers(tmp_path: Path, drivers: list[Driver]) -> None:
    budget = tmp_path / "crashes"
    budget.write_text("1000")
    async with control_plane(tmp_path) as cp:
        start(tmp_path, cp.url, drivers, mode="crash-on-start", agent_env={"STUBBORN_CRASHES": str(budget)})
        loop = await wait_diagnostic(cp, "provider.crash_loop")
        assert loop["payload"]["details"]["crashes"] >= 5 and loop["payload"]["details"]["limit"] == 5
        restarting = [e["payload"] for e in cp.events(INSTANCE, "diagnostic.reported")]
        delays = [p["details"]["delay_ms"] for p in restarting if p["code"] == "provider.restarting"]
        assert delays[:4] == [0, 20, 40, 80]  # backoff doubles from 20 ms, capped at 100 ms

        t0 = now()
        status = await run(cp, "run-loop", "hello", timeout=10)
        assert now() - t0 < 3.0  # fails fast: no waiting for a start
        assert status["status"] == "failed"
        assert status["error"]["code"] == "provider.crash_loop" and status["error"]["retryable"] is True
        [terminal] = terminals(cp, "run-loop")
        assert terminal["payload"]["error"]["code"] == "provider.crash_loop"

        budget.write_text("0")  # the next start succeeds
        await wait_diagnostic(cp, "provider.crash_loop_cleared", after_seq=terminal["seq"])
        status = await run(cp, "run-ok", "[[say:recovered]]")
        assert status["status"] == "completed"


async def test_start_that_never_finishes_is_bounded_and_inputs_fail_clearly(
    tmp_path: Path, drivers: list[Driver]
) -> None:
    async with control_plane(tmp_path) as cp:
        d = start(tmp_path, cp.url, drivers, mode="no-init", env={"AGENT_DRIVER_PROVIDER_START_TIMEOUT_MS": "500"})
        t0 = now()
        first = await wait_provider(d)
        timeout = await wait_diagnostic(cp, "provider.start_timeout")
        assert now() - t0 < 5.0
        assert timeout["payload"]["message"] == "the provider did not start within 0.5 s"
        await wait_group_gone(first)  # the stuck process was stopped, not left behind
        started = await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=10)
        assert started["payload"]["timings"]["provider_start_ms"] is None

        status = await run(cp, "run-1", "hello", timeout=10)
        assert status["status"] == "failed"
        assert status["error"]["code"] in ("provider.start_timeout", "provider.crash_loop")
        assert status["error"]["retryable"] is True
        [terminal] = terminals(cp, "run-1")
        assert terminal["payload"]["error"]["code"] == status["error"]["code"]
        assert len(children(d.pid)) <= 1  # retried starts never pile up processes


async def test_silent_provider_fails_the_run_as_unresponsive(tmp_path: Path, drivers: list[Driver]) -> None:
    async with control_plane(tmp_path) as cp:
        d = start(tmp_path, cp.url, drivers, env={"AGENT_DRIVER_PROVIDER_SILENCE_MS": "700"})
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=20)
        first = await wait_provider(d)
        t0 = now()
        status = await run(cp, "run-hang", "[[hang]]")
        assert 0.7 <= now() - t0 < 5.0
        assert status["status"] == "failed" and status["error"]["code"] == "provider.unresponsive"
        # The silent provider is replaced before the next run.
        await wait_group_gone(first)
        status = await run(cp, "run-2", "[[say:fresh provider]]")
        assert status["status"] == "completed"


# -- stop and signals ---------------------------------------------------------------------------------


async def test_session_stop_during_a_run_cancels_stops_the_provider_and_exits_zero(
    tmp_path: Path, drivers: list[Driver]
) -> None:
    async with control_plane(tmp_path) as cp:
        d = start(tmp_path, cp.url, drivers, mode="ignore-cancel")
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=20)
        pgid = await wait_provider(d)
        input_cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-s", input={"text": "[[slow]]"})
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "message.delta" and e["run_id"] == "run-s")
        stop, _ = await cp.send_command(INSTANCE, "session.stop", reason="done")
        assert await d.wait(15) == 0
        assert (cp.command(stop) or {})["status"] == "completed"
        terminal = await wait_terminal(cp, "run-s", timeout=5)
        assert terminal["kind"] == "run.cancelled"
        assert terminal["payload"]["reason"] == "done" and terminal["payload"]["details"]["phase"] == "terminate"
        assert (cp.command(input_cid) or {})["status"] == "cancelled"
        await wait_group_gone(pgid)


async def test_sigterm_stops_like_session_stop_and_exits_zero(tmp_path: Path, drivers: list[Driver]) -> None:
    async with control_plane(tmp_path) as cp:
        d = start(tmp_path, cp.url, drivers)
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=20)
        pgid = await wait_provider(d)
        await cp.send_command(INSTANCE, "input.start", run_id="run-t", input={"text": "[[slow]]"})
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "message.delta" and e["run_id"] == "run-t")
        d.signal(signal.SIGTERM)
        assert await d.wait(15) == 0
        terminal = await wait_terminal(cp, "run-t", timeout=5)
        assert terminal["kind"] == "run.cancelled"
        assert terminal["payload"]["reason"] == "signal" and terminal["payload"]["requested_by"] == "signal"
        await wait_group_gone(pgid)
        assert TOKEN not in d.stderr()


async def test_second_signal_exits_at_once(tmp_path: Path, drivers: list[Driver]) -> None:
    async with control_plane(tmp_path) as cp:
        # Default graces (5 s + 3 s) and a provider deaf to cancel and SIGTERM: a clean stop is slow.
        d = start(
            tmp_path,
            cp.url,
            drivers,
            mode="ignore-term",
            env={"AGENT_DRIVER_CANCEL_GRACE_MS": "5000", "AGENT_DRIVER_TERM_GRACE_MS": "3000"},
        )
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=20)
        pgid = await wait_provider(d)
        await cp.send_command(INSTANCE, "input.start", run_id="run-x", input={"text": "[[slow]]"})
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "message.delta" and e["run_id"] == "run-x")
        d.signal(signal.SIGTERM)
        await cp.wait_until(lambda: (cp.last_heartbeat(INSTANCE) or {}).get("state") == "stopping", timeout=5)
        t0 = now()
        d.signal(signal.SIGINT)
        status = await d.wait(5)
        assert now() - t0 < 2.0
        assert status == 128 + signal.SIGINT
        await wait_group_gone(pgid, timeout=2)


# -- the real runtimes --------------------------------------------------------------------------------


@pytest.mark.provider
@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_real_runtime_killed_while_idle_is_restarted(
    tmp_path: Path, drivers: list[Driver], fakes: Fakes, runtime: str
) -> None:
    async with control_plane(tmp_path) as cp:
        d = Driver(tmp_path, runtimes.payload(runtime, tmp_path, cp.url, fakes), env=FAST)
        drivers.append(d)
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=60)
        pgid = await wait_provider(d)
        os.killpg(pgid, signal.SIGKILL)
        exited = await wait_diagnostic(cp, "provider.exited", timeout=30)
        await wait_diagnostic(cp, "provider.restarted", after_seq=exited["seq"], timeout=60)
        assert await wait_provider(d) != pgid
        status = await run(cp, "run-1", "[[say:back again]]", timeout=60)
        assert status["status"] == "completed", status
