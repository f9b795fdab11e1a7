"""Faults against the REAL driver process and the reference control plane, then a history check.

The provider is the flood agent (agent_lab/testing/agents), a real ACP agent that emits numbered steps, so a hole
or a duplicate in the stored history is visible. After every fault, `history.check_run` judges what the
control plane stored (see its docstring). Waits are on control-plane events, statuses and heartbeats
with timeouts; the only fixed pause is the length of the control-plane outage in
`test_control_plane_restart_mid_run`, which is the fault itself, not a wait for something.
"""

from __future__ import annotations

import re
from typing import Any

import anyio
import pytest
from agent_lab.controlplane.server import ControlPlane

from tests.faults.conftest import Drivers
from tests.faults.history import check_instance, check_run, lossless, steps
from tests.integration.harness import INSTANCE, control_plane

pytestmark = pytest.mark.faults


# -- helpers -------------------------------------------------------------------------------------------


async def booted(cp: ControlPlane, epoch: int = 1) -> None:
    await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started" and e["epoch"] == epoch, timeout=30)


async def start_run(cp: ControlPlane, run_id: str, text: str) -> str:
    cid, _ = await cp.send_command(INSTANCE, "input.start", run_id=run_id, input={"text": text})
    return cid


def _step(e: dict[str, Any]) -> int:
    m = re.fullmatch(r"step (\d+)", e["payload"]["entries"][0]["content"])
    return int(m.group(1)) if m else -1


async def wait_step(cp: ControlPlane, run_id: str, n: int, timeout: float = 30) -> None:
    """Until the flood agent's step `n` (or a later one) of `run_id` is stored."""
    await cp.wait_for_event(
        INSTANCE, lambda e: e["run_id"] == run_id and e["kind"] == "plan.updated" and _step(e) >= n, timeout=timeout
    )


async def next_heartbeat(cp: ControlPlane, timeout: float = 10) -> dict[str, Any]:
    item = await cp.wait_for(INSTANCE, lambda i: i["type"] == "heartbeat", timeout=timeout)
    return item


async def drained_heartbeat(cp: ControlPlane, timeout: float = 15) -> dict[str, Any]:
    """The first heartbeat with nothing lossless pending. A command's status travels twice: the fast
    `command.update` and the lossless `command.finished` fact admitted just before it, so the heartbeat
    right after a status may still count that fact as pending for one receipt's round trip."""
    item = await cp.wait_for(
        INSTANCE, lambda i: i["type"] == "heartbeat" and i["outbox"]["lossless_pending"] == 0, timeout=timeout
    )
    return item


async def status(cp: ControlPlane, cid: str, timeout: float = 40) -> dict[str, Any]:
    return await cp.wait_for_command_status(cid, timeout=timeout)


# -- 1. the link dies mid-stream ------------------------------------------------------------------------


async def test_link_killed_mid_stream(tmp_path: Any, drivers: Drivers) -> None:
    async with control_plane(tmp_path) as cp:
        drivers.start(cp.url)
        await booted(cp)

        # A run that completes after the TCP connection is dropped under it.
        cid = await start_run(cp, "run-1", "[[flood:60:40]]")
        await wait_step(cp, "run-1", 10)
        assert await cp.close_link(INSTANCE, 1006)
        await cp.wait_until(lambda: any(h["close_code"] == 1006 for h in cp.link_history(INSTANCE)), timeout=10)
        await cp.wait_connected(INSTANCE, timeout=20)
        assert (await status(cp, cid))["status"] == "completed"

        # A run cancelled right after another drop: the cancel command reaches the driver after the
        # reconnect (replayed after welcome) or on the new link, and wins.
        cid2 = await start_run(cp, "run-2", "[[flood:400:40]]")
        await wait_step(cp, "run-2", 5)
        assert await cp.close_link(INSTANCE, 1006)
        cancel, _ = await cp.send_command(INSTANCE, "turn.cancel", run_id="run-2", reason="user")
        assert (await status(cp, cancel))["status"] == "completed"
        assert (await status(cp, cid2))["status"] == "cancelled"

        hb = await next_heartbeat(cp)
        dropped = hb["outbox"]["best_effort_dropped"]
        check_run(cp, "run-1", terminal="run.completed", flood_steps=60, heartbeat_dropped=dropped)
        term = check_run(cp, "run-2", terminal="run.cancelled", flood_steps=400, heartbeat_dropped=dropped)
        assert term["payload"]["requested_by"] == "control_plane"
        assert len(cp.link_history(INSTANCE)) >= 2
        hello = cp.hello(INSTANCE)
        assert hello is not None and hello["epoch"] == 1  # the same process throughout


# -- 2. the control plane goes away and comes back on the same database ------------------------------


async def test_control_plane_restart_mid_run(tmp_path: Any, drivers: Drivers) -> None:
    async with control_plane(tmp_path) as cp:
        drivers.start(cp.url)
        await booted(cp)
        cid = await start_run(cp, "run-1", "[[flood:80:40]]")
        await wait_step(cp, "run-1", 10)
        stored_before = len(lossless(cp.events(INSTANCE)))

        await cp.stop(1012)
        await anyio.sleep(1.0)  # the outage: the run keeps producing into the journal meanwhile
        await cp.start()

        assert (await status(cp, cid))["status"] == "completed"
        hb = await drained_heartbeat(cp)
        assert hb["outbox"]["lossless_pending"] == 0
        # A delta every 40 ms during a >1 s outage: some were dropped, and the drops were counted.
        assert hb["outbox"]["best_effort_dropped"] > 0
        check_run(
            cp,
            "run-1",
            terminal="run.completed",
            flood_steps=80,
            heartbeat_dropped=hb["outbox"]["best_effort_dropped"],
        )
        assert len(lossless(cp.events(INSTANCE))) > stored_before
        codes = [h["close_code"] for h in cp.link_history(INSTANCE)]
        assert 1012 in codes
        hello = cp.hello(INSTANCE)
        assert hello is not None and hello["epoch"] == 1


# -- 3. the driver is SIGKILLed and a new process takes over ------------------------------------------


async def test_driver_sigkill_restart_resends_journal(tmp_path: Any, drivers: Drivers) -> None:
    async with control_plane(tmp_path) as cp:
        d1 = drivers.start(cp.url)
        await booted(cp)
        stored_before = {e["event_id"] for e in cp.events(INSTANCE)}
        # Nothing is stored (every receipt lists nothing): all the run's events stay journaled.
        cp.faults.partial_receipt_events = 0
        cid = await start_run(cp, "run-k", "[[flood:400:20]]")
        await cp.wait_until(
            lambda: (hb := cp.last_heartbeat(INSTANCE)) is not None and hb["outbox"]["lossless_pending"] >= 30,
            timeout=20,
        )
        # Deltas went out and were left out of every receipt: dropped, and counted.
        await cp.wait_until(
            lambda: (hb := cp.last_heartbeat(INSTANCE)) is not None and hb["outbox"]["best_effort_dropped"] > 0,
            timeout=10,
        )
        old_dropped = (cp.last_heartbeat(INSTANCE) or {})["outbox"]["best_effort_dropped"]
        d1.kill()
        await cp.wait_disconnected(INSTANCE, timeout=10)
        cp.faults.reset()

        drivers.start(cp.url)
        await cp.wait_connected(INSTANCE, timeout=30)
        hello = cp.hello(INSTANCE)
        assert hello is not None and hello["epoch"] == 2
        backlog = hello["outbox"]["lossless_pending"]
        oldest = hello["outbox"]["oldest_pending_seq"]
        assert backlog >= 30 and oldest is not None

        term = await cp.wait_for_event(
            INSTANCE, lambda e: e["run_id"] == "run-k" and e["kind"] in ("run.completed", "run.failed", "run.cancelled")
        )
        assert term["kind"] == "run.failed" and term["epoch"] == 2
        assert term["payload"]["error"]["code"] == "driver.restarted"
        st = await status(cp, cid)
        assert st["status"] == "failed" and st["error"]["code"] == "driver.restarted"
        await booted(cp, epoch=2)

        # What the dead process journaled arrived now, under its own ids: epoch 1 in id and field.
        resent = [e for e in lossless(cp.events(INSTANCE)) if e["event_id"] not in stored_before and e["epoch"] == 1]
        assert resent, "nothing of the dead process was resent"
        assert min(e["seq"] for e in resent) == oldest
        # The backlog reported in hello is those events plus what the new process admitted before
        # saying hello (its run.failed, maybe driver.started).
        assert len(resent) <= backlog <= len(resent) + 2
        assert resent[0]["kind"] == "run.started" and resent[0]["run_id"] == "run-k"
        assert all(e["seq"] < term["seq"] for e in resent)
        check_run(cp, "run-k", terminal="run.failed", flood_steps=400, heartbeat_dropped=old_dropped)
        assert steps(cp.events(INSTANCE, run_id="run-k")), "no step survived"

        # The new process carries on.
        cid2 = await start_run(cp, "run-2", "[[flood:5]]")
        assert (await status(cp, cid2))["status"] == "completed"
        check_run(cp, "run-2", terminal="run.completed", flood_steps=5)


# -- 4. receipts withheld until the outbox is full ----------------------------------------------------


async def test_full_outbox_holds_the_provider_back(tmp_path: Any, drivers: Drivers) -> None:
    bound = 24
    async with control_plane(tmp_path) as cp:
        drivers.start(cp.url, outbox_max_events=bound)
        await booted(cp)
        before = {e["event_id"] for e in lossless(cp.events(INSTANCE))}
        cp.faults.withhold_receipts = True
        cid = await start_run(cp, "run-1", "[[flood:100]]")
        await cp.wait_until(
            lambda: (hb := cp.last_heartbeat(INSTANCE)) is not None and hb["outbox"]["lossless_pending"] >= bound,
            timeout=20,
        )
        # Three more heartbeats: the bound holds, the run cannot finish, nothing beyond it is stored.
        for _ in range(3):
            hb = await next_heartbeat(cp)
            assert hb["outbox"]["lossless_pending"] == bound
            assert hb["state"] == "running"
        new = [e for e in lossless(cp.events(INSTANCE)) if e["event_id"] not in before]
        assert len(new) <= bound
        assert max(steps(cp.events(INSTANCE, run_id="run-1")), default=-1) < 99
        assert (cp.command(cid) or {})["status"] not in ("completed", "failed", "cancelled")

        # Release: the unreceipted batches are resent after their receipt timeout, and it all flows.
        cp.faults.withhold_receipts = False
        assert (await status(cp, cid, timeout=60))["status"] == "completed"
        hb = await drained_heartbeat(cp)
        assert hb["outbox"]["lossless_pending"] == 0
        check_run(
            cp,
            "run-1",
            terminal="run.completed",
            flood_steps=100,
            heartbeat_dropped=hb["outbox"]["best_effort_dropped"],
        )


# -- 5. partial, duplicate, delayed and late receipts ------------------------------------------------


@pytest.mark.parametrize(
    "knobs",
    [
        pytest.param({"partial_receipt_events": 2}, id="partial"),
        pytest.param({"duplicate_receipts": True}, id="duplicate"),
        pytest.param({"receipt_delay_ms": 300}, id="delayed"),
        pytest.param({"reorder_receipts": True}, id="late"),
    ],
)
async def test_receipt_faults_mid_run(tmp_path: Any, drivers: Drivers, knobs: dict[str, Any]) -> None:
    async with control_plane(tmp_path) as cp:
        drivers.start(cp.url)
        await booted(cp)
        cp.faults.update(knobs)
        cid = await start_run(cp, "run-1", "[[flood:60:30]]")
        await wait_step(cp, "run-1", 8)
        cp.faults.reset()
        assert (await status(cp, cid, timeout=60))["status"] == "completed"
        hb = await next_heartbeat(cp)
        check_run(
            cp, "run-1", terminal="run.completed", flood_steps=60, heartbeat_dropped=hb["outbox"]["best_effort_dropped"]
        )
        check_instance(cp)
