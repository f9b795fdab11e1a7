"""PROTOCOL §5 through the real driver process: the cancel state machine (interrupt → SIGTERM → SIGKILL
→ restart), cancelled permissions, and a cancel racing the natural end of a run.

The provider is our stubborn ACP agent (agent_lab/testing/agents/stubborn_acp_agent.py), a real process that
misbehaves on cue; the grace periods are shortened through AGENT_DRIVER_CANCEL_GRACE_MS and
AGENT_DRIVER_TERM_GRACE_MS. The tests marked `provider` do the same against each real runtime.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import INSTANCE, boot_payload, control_plane, kinds
from tests.kernel import runtimes
from tests.kernel.runtimes import RUNTIMES, Fakes
from tests.kernel.support import (
    TERMINALS,
    Driver,
    group_alive,
    now,
    terminals,
    wait_diagnostic,
    wait_group_gone,
    wait_provider,
    wait_terminal,
)

GRACE = {"AGENT_DRIVER_CANCEL_GRACE_MS": "400", "AGENT_DRIVER_TERM_GRACE_MS": "400"}


def start(tmp: Path, url: str, drivers: list[Driver], *, env: dict[str, str] | None = None, **kw: Any) -> Driver:
    d = Driver(tmp, boot_payload(tmp, url, **kw), env={**GRACE, **(env or {})})
    drivers.append(d)
    return d


async def started_run(cp: Any, run_id: str, text: str) -> str:
    cid, _ = await cp.send_command(INSTANCE, "input.start", run_id=run_id, input={"text": text})
    await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "message.delta" and e["run_id"] == run_id, timeout=20)
    return cid


async def cancel(cp: Any, run_id: str, timeout: float = 20) -> dict[str, Any]:
    cid, _ = await cp.send_command(INSTANCE, "turn.cancel", run_id=run_id, reason="user")
    status: dict[str, Any] = await cp.wait_for_command_status(cid, timeout=timeout)
    return status


async def assert_next_run_works(cp: Any, run_id: str) -> None:
    cid, _ = await cp.send_command(INSTANCE, "input.start", run_id=run_id, input={"text": f"[[say:{run_id} ok]]"})
    status = await cp.wait_for_command_status(cid, timeout=30)
    assert status["status"] == "completed", status
    assert terminals(cp, run_id)[-1]["payload"]["final_message_text"] == f"{run_id} ok"


@pytest.mark.serial  # cancel to signal in bounded time (< 3 s)
@pytest.mark.parametrize(("mode", "phase"), [("ignore-cancel", "terminate"), ("ignore-term", "kill")])
async def test_escalation_reaches_signals_in_bounded_time_then_restarts(
    tmp_path: Path, drivers: list[Driver], mode: str, phase: str
) -> None:
    async with control_plane(tmp_path) as cp:
        d = start(tmp_path, cp.url, drivers, mode=mode)
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=20)
        pgid = await wait_provider(d)
        input_cid = await started_run(cp, "run-1", "[[slow]]")

        t0 = now()
        status = await cancel(cp, "run-1")
        elapsed = now() - t0
        # interrupt grace 0.4 s (+ terminate grace 0.4 s for kill), plus round trips on a busy machine;
        # the default graces (5 s + 3 s) would take far longer.
        assert elapsed < (3.0 if phase == "terminate" else 3.5), elapsed
        assert status["status"] == "completed"
        assert status["result"]["terminal"] == "run.cancelled" and status["result"]["phase"] == phase

        terminal = terminals(cp, "run-1")
        assert [t["kind"] for t in terminal] == ["run.cancelled"]
        details = terminal[0]["payload"]["details"]
        assert details["phase"] == phase
        assert details["signalled_process_groups"] == [pgid]
        # PROTOCOL §5: what the run left is said, not undone; a signalled provider tree left nothing.
        effects = terminal[0]["payload"]["side_effects"]
        assert effects["files_changed"] == [] and effects["processes_left"] == []
        assert (await cp.wait_for_command_status(input_cid, timeout=10))["status"] == "cancelled"
        await wait_group_gone(pgid)

        # Killed, not crashed: restarted for the next run without counting a crash.
        restarting = await wait_diagnostic(cp, "provider.restarting")
        assert restarting["payload"]["details"]["crashed"] is False
        await assert_next_run_works(cp, "run-2")
        assert await wait_provider(d) != pgid


async def test_cancel_while_permission_pending(tmp_path: Path, drivers: list[Driver]) -> None:
    async with control_plane(tmp_path) as cp:
        start(tmp_path, cp.url, drivers)
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=20)
        input_cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-p", input={"text": "[[perm]]"})
        asked = await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "permission.requested", timeout=20)

        status = await cancel(cp, "run-p")
        assert status["result"]["phase"] == "interrupt"
        resolved = cp.events(INSTANCE, "permission.resolved", run_id="run-p")
        assert len(resolved) == 1
        assert resolved[0]["payload"]["request_id"] == asked["payload"]["request_id"]
        assert resolved[0]["payload"]["outcome"] == "cancelled"
        assert resolved[0]["payload"]["decided_by"] == "cancel"
        terminal = terminals(cp, "run-p")
        assert [t["kind"] for t in terminal] == ["run.cancelled"]
        assert asked["payload"]["tool_call_id"] in terminal[0]["payload"]["details"]["tool_calls_started"]
        assert resolved[0]["seq"] < terminal[0]["seq"]
        assert (await cp.wait_for_command_status(input_cid, timeout=10))["status"] == "cancelled"
        await assert_next_run_works(cp, "run-q")


async def test_cancel_racing_the_natural_end_has_one_consistent_terminal(tmp_path: Path, drivers: list[Driver]) -> None:
    status_of = {"run.completed": "completed", "run.cancelled": "cancelled", "run.failed": "failed"}
    async with control_plane(tmp_path) as cp:
        start(tmp_path, cp.url, drivers)
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=20)
        seen: set[str] = set()
        for i in range(8):
            run_id = f"race-{i}"
            # Run 0 streams for long, so at least one cancel surely wins; the others race a quick reply.
            text = {"text": "[[slow]]" if i == 0 else "[[say:quick]]"}
            input_cid, _ = await cp.send_command(INSTANCE, "input.start", run_id=run_id, input=text)
            if i % 2:
                # Let the run get further before the cancel lands.
                await cp.wait_for_event(INSTANCE, lambda e, r=run_id: e["run_id"] == r and e["kind"] == "run.started")
            cancel_status = await cancel(cp, run_id)
            input_status = await cp.wait_for_command_status(input_cid, timeout=20)
            terminal = await wait_terminal(cp, run_id)
            evs = cp.events(INSTANCE, run_id=run_id)
            assert [e["kind"] for e in evs if e["kind"] in TERMINALS] == [terminal["kind"]]
            assert evs[-1]["kind"] == terminal["kind"]  # nothing run-scoped after the terminal
            assert input_status["status"] == status_of[terminal["kind"]]
            assert cancel_status["status"] == "completed"
            result = cancel_status["result"]
            if result.get("already_terminal"):
                assert terminal["kind"] != "run.cancelled"
            else:
                assert result["terminal"] == terminal["kind"]
            seen.add(terminal["kind"])
        assert seen <= {"run.completed", "run.cancelled"}
        assert "run.cancelled" in seen
        assert kinds(cp.events(INSTANCE, "run.failed")) == []


# -- the real runtimes --------------------------------------------------------------------------------


@pytest.mark.provider
@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_real_runtime_cancel_mid_stream_and_while_permission_pending(
    tmp_path: Path, drivers: list[Driver], fakes: Fakes, runtime: str
) -> None:
    async with control_plane(tmp_path) as cp:
        d = Driver(tmp_path, runtimes.payload(runtime, tmp_path, cp.url, fakes), env=GRACE)
        drivers.append(d)
        started = await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=60)
        assert started["payload"]["timings"]["provider_start_ms"] is not None, d.stderr()[-2000:]

        # Mid-stream: the runtime's own interrupt ends the run (no signals needed).
        input_cid = await started_run(cp, "run-slow", runtimes.SLOW)
        status = await cancel(cp, "run-slow")
        assert status["result"] == {"run_id": "run-slow", "terminal": "run.cancelled", "phase": "interrupt"}
        assert (await cp.wait_for_command_status(input_cid, timeout=10))["status"] == "cancelled"
        assert [t["kind"] for t in terminals(cp, "run-slow")] == ["run.cancelled"]

        # While a permission is pending: resolved `cancelled` by the cancel, the tool call listed.
        input_cid, _ = await cp.send_command(
            INSTANCE, "input.start", run_id="run-perm", input={"text": runtimes.PERMISSION[runtime]}
        )
        asked = await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "permission.requested", timeout=60)
        status = await cancel(cp, "run-perm")
        assert status["result"]["terminal"] == "run.cancelled"
        resolved = cp.events(INSTANCE, "permission.resolved", run_id="run-perm")
        assert [(r["payload"]["outcome"], r["payload"]["decided_by"]) for r in resolved] == [("cancelled", "cancel")]
        [terminal] = terminals(cp, "run-perm")
        assert terminal["kind"] == "run.cancelled"
        assert asked["payload"]["tool_call_id"] in terminal["payload"]["details"]["tool_calls_started"]
        assert (await cp.wait_for_command_status(input_cid, timeout=10))["status"] == "cancelled"
        assert not (tmp_path / "cwd" / "notes.txt").exists()

        # A cancel racing the natural end of a short turn: exactly one terminal, whichever won, and
        # both command statuses agree with it.
        race_cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-race", input={"text": "[[say:quick]]"})
        status = await cancel(cp, "run-race")
        terminal = await wait_terminal(cp, "run-race")
        assert [t["kind"] for t in terminals(cp, "run-race")] == [terminal["kind"]]
        assert terminal["kind"] in ("run.completed", "run.cancelled")
        expected = "cancelled" if terminal["kind"] == "run.cancelled" else "completed"
        assert (await cp.wait_for_command_status(race_cid, timeout=30))["status"] == expected
        if status["result"].get("already_terminal"):
            assert terminal["kind"] == "run.completed"
        else:
            assert status["result"]["terminal"] == terminal["kind"]

        # The runtime is still usable afterwards.
        await assert_next_run_works(cp, "run-after")


async def test_cancel_while_the_run_waits_for_its_provider_ends_it_at_once(
    tmp_path: Path, drivers: list[Driver]
) -> None:
    async with control_plane(tmp_path) as cp:
        env = {"AGENT_DRIVER_PROVIDER_START_TIMEOUT_MS": "30000", "AGENT_DRIVER_CANCEL_GRACE_MS": "5000"}
        d = start(tmp_path, cp.url, drivers, mode="no-init", env=env)
        starting = await wait_provider(d)
        input_cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-w", input={"text": "hi"})
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "run.started" and e["run_id"] == "run-w")
        t0 = now()
        status = await cancel(cp, "run-w")
        assert now() - t0 < 3.0  # not the 5 s interrupt grace: there is no turn to interrupt yet
        assert status["result"]["phase"] == "interrupt"
        [terminal] = terminals(cp, "run-w")
        assert terminal["kind"] == "run.cancelled"
        assert terminal["payload"]["details"]["signalled_process_groups"] == []
        assert (await cp.wait_for_command_status(input_cid, timeout=10))["status"] == "cancelled"
        # The provider still starting was left alone (it belongs to the next run).
        assert group_alive(starting)
