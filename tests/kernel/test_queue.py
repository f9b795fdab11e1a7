"""PROTOCOL §3.1 queue through the real driver process: `input.start{"queue": true}` while a run is
active is held, journaled, and started in seq order; the 16 bound; cancel of a queued run; stop; and a
queued run surviving a driver SIGKILL.

The provider is our stubborn ACP agent (a real process, model-free, fast); the queue is the kernel's,
the same for every runtime (tests/kernel/test_steer.py drives the real runtimes).
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import INSTANCE, boot_payload, control_plane
from tests.kernel import runtimes
from tests.kernel.runtimes import RUNTIMES, Fakes
from tests.kernel.support import TERMINALS, Driver, terminals, wait_terminal

SLOW = "[[slow]]"


def start(tmp: Path, url: str, drivers: list[Driver], name: str = "driver") -> Driver:
    d = Driver(tmp, boot_payload(tmp, url), name=name)
    drivers.append(d)
    return d


async def slow_run(cp: Any, run_id: str) -> str:
    cid, _ = await cp.send_command(INSTANCE, "input.start", run_id=run_id, input={"text": SLOW})
    await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "message.delta" and e["run_id"] == run_id, timeout=20)
    return cid


async def queue(cp: Any, run_id: str, text: str) -> str:
    cid, _ = await cp.send_command(INSTANCE, "input.start", run_id=run_id, input={"text": text}, queue=True)
    await cp.wait_for_command_status(cid, "accepted", timeout=10)
    return cid


async def queued_in_heartbeat(cp: Any, expected: list[str], timeout: float = 10) -> dict[str, Any]:
    beat: dict[str, Any] = await cp.wait_for(
        INSTANCE, lambda i: i["type"] == "heartbeat" and i.get("queued") == expected, timeout=timeout
    )
    return beat


def started(cp: Any, run_id: str) -> list[dict[str, Any]]:
    return [e for e in cp.events(INSTANCE, run_id=run_id) if e["kind"] == "run.started"]


async def test_queued_runs_start_in_seq_order_each_after_the_run_before_is_terminal(
    tmp_path: Path, drivers: list[Driver]
) -> None:
    async with control_plane(tmp_path) as cp:
        start(tmp_path, cp.url, drivers)
        await slow_run(cp, "run-1")
        cids = [await queue(cp, f"run-{i}", f"[[say:queued {i}]]") for i in (2, 3, 4)]
        beat = await queued_in_heartbeat(cp, ["run-2", "run-3", "run-4"])
        assert beat["run_id"] == "run-1"
        # Nothing queued has started while run-1 runs.
        assert all(not started(cp, f"run-{i}") for i in (2, 3, 4))
        await cp.send_command(INSTANCE, "turn.cancel", run_id="run-1", reason="next")
        for cid in cids:
            assert (await cp.wait_for_command_status(cid, timeout=30))["status"] == "completed"
        events = cp.events(INSTANCE)
        seq_of = {(e["run_id"], e["kind"]): e["seq"] for e in events if e["kind"] in ("run.started", *TERMINALS)}
        for before, after in (("run-1", "run-2"), ("run-2", "run-3"), ("run-3", "run-4")):
            terminal_before = next(v for (r, k), v in seq_of.items() if r == before and k in TERMINALS)
            assert terminal_before < seq_of[(after, "run.started")], (before, after)
        for i in (1, 2, 3, 4):
            assert len(terminals(cp, f"run-{i}")) == 1
        assert [terminals(cp, f"run-{i}")[0]["payload"]["final_message_text"] for i in (2, 3, 4)] == [
            "queued 2",
            "queued 3",
            "queued 4",
        ]
        await queued_in_heartbeat(cp, [])


async def test_at_most_16_are_held_and_a_plain_input_start_is_still_refused(
    tmp_path: Path, drivers: list[Driver]
) -> None:
    async with control_plane(tmp_path) as cp:
        start(tmp_path, cp.url, drivers)
        await slow_run(cp, "run-0")
        for i in range(16):
            await cp.send_command(INSTANCE, "input.start", run_id=f"q-{i}", input={"text": "hi"}, queue=True)
        await queued_in_heartbeat(cp, [f"q-{i}" for i in range(16)])
        full, _ = await cp.send_command(INSTANCE, "input.start", run_id="q-16", input={"text": "hi"}, queue=True)
        status = await cp.wait_for_command_status(full, timeout=10)
        assert status["status"] == "failed"
        assert status["error"]["code"] == "driver.queue_full" and status["error"]["retryable"] is True
        plain, _ = await cp.send_command(INSTANCE, "input.start", run_id="p-1", input={"text": "hi"})
        status = await cp.wait_for_command_status(plain, timeout=10)
        assert status["error"]["code"] == "driver.run_active"
        assert not started(cp, "q-16") and not started(cp, "p-1")


async def test_cancel_of_a_queued_run_ends_it_without_run_started(tmp_path: Path, drivers: list[Driver]) -> None:
    async with control_plane(tmp_path) as cp:
        start(tmp_path, cp.url, drivers)
        await slow_run(cp, "run-1")
        q2 = await queue(cp, "run-2", "[[say:two]]")
        q3 = await queue(cp, "run-3", "[[say:three]]")
        cancel, _ = await cp.send_command(INSTANCE, "turn.cancel", run_id="run-2", reason="changed my mind")
        status = await cp.wait_for_command_status(cancel, timeout=10)
        assert status["status"] == "completed"
        assert status["result"] == {"run_id": "run-2", "terminal": "run.cancelled", "phase": "queued"}
        assert (await cp.wait_for_command_status(q2, timeout=10))["status"] == "cancelled"
        [terminal] = terminals(cp, "run-2")
        assert terminal["kind"] == "run.cancelled"
        assert terminal["payload"]["details"]["phase"] == "queued"
        assert terminal["payload"]["reason"] == "changed my mind"
        assert not started(cp, "run-2")
        await queued_in_heartbeat(cp, ["run-3"])
        # The active run is untouched, and the next queued one still follows it.
        assert not terminals(cp, "run-1")
        await cp.send_command(INSTANCE, "turn.cancel", run_id="run-1", reason="next")
        assert (await cp.wait_for_command_status(q3, timeout=30))["status"] == "completed"
        assert not started(cp, "run-2") and len(terminals(cp, "run-2")) == 1


async def test_session_stop_cancels_every_queued_run(tmp_path: Path, drivers: list[Driver]) -> None:
    async with control_plane(tmp_path) as cp:
        d = start(tmp_path, cp.url, drivers)
        await slow_run(cp, "run-1")
        queued = [await queue(cp, f"run-{i}", "[[say:never]]") for i in (2, 3)]
        await queued_in_heartbeat(cp, ["run-2", "run-3"])
        await cp.send_command(INSTANCE, "session.stop", reason="done")
        assert await d.wait(30) == 0
        for cid in queued:
            assert (await cp.wait_for_command_status(cid, timeout=10))["status"] == "cancelled"
        for run_id in ("run-2", "run-3"):
            [terminal] = terminals(cp, run_id)
            assert terminal["kind"] == "run.cancelled" and terminal["payload"]["details"]["phase"] == "queued"
            assert not started(cp, run_id)
        assert [t["kind"] for t in terminals(cp, "run-1")] == ["run.cancelled"]


async def test_a_queued_run_survives_a_driver_sigkill(tmp_path: Path, drivers: list[Driver]) -> None:
    async with control_plane(tmp_path) as cp:
        d = start(tmp_path, cp.url, drivers)
        await slow_run(cp, "run-1")
        q2 = await queue(cp, "run-2", "[[say:after the crash]]")
        q3 = await queue(cp, "run-3", "[[say:and then]]")
        # Listed in a heartbeat: held, and so journaled (the body is written before it is held).
        await queued_in_heartbeat(cp, ["run-2", "run-3"])
        d.signal(signal.SIGKILL)
        await d.wait(10)
        await cp.wait_disconnected(INSTANCE)
        start(tmp_path, cp.url, drivers, name="driver-2")
        failed = await wait_terminal(cp, "run-1", timeout=30)
        assert failed["kind"] == "run.failed" and failed["payload"]["error"]["code"] == "driver.restarted"
        assert (await cp.wait_for_command_status(q2, timeout=30))["status"] == "completed"
        assert (await cp.wait_for_command_status(q3, timeout=30))["status"] == "completed"
        assert terminals(cp, "run-2")[0]["payload"]["final_message_text"] == "after the crash"
        assert terminals(cp, "run-3")[0]["payload"]["final_message_text"] == "and then"
        seq = {r: started(cp, r)[0]["seq"] for r in ("run-2", "run-3")}
        assert failed["seq"] < seq["run-2"] < terminals(cp, "run-2")[0]["seq"] < seq["run-3"]
        for run_id in ("run-1", "run-2", "run-3"):
            assert len(terminals(cp, run_id)) == 1


async def test_session_reset_cancels_every_queued_run_first(tmp_path: Path, drivers: list[Driver]) -> None:
    async with control_plane(tmp_path) as cp:
        start(tmp_path, cp.url, drivers)
        await slow_run(cp, "run-1")
        q2 = await queue(cp, "run-2", "[[say:never]]")
        reset, _ = await cp.send_command(INSTANCE, "session.reset", reason="fresh start")
        # The queue goes at once; the reset itself still waits for no run to be active.
        status = await cp.wait_for_command_status(reset, timeout=10)
        assert status["status"] == "failed" and status["error"]["code"] == "driver.run_active"
        assert (await cp.wait_for_command_status(q2, timeout=10))["status"] == "cancelled"
        [terminal] = terminals(cp, "run-2")
        assert terminal["payload"]["details"]["phase"] == "queued" and terminal["payload"]["reason"] == "fresh start"
        # So a control plane can cancel the active run and reset, with nothing queued starting between.
        cancel, _ = await cp.send_command(INSTANCE, "turn.cancel", run_id="run-1", reason="reset")
        await cp.wait_for_command_status(cancel, timeout=20)
        reset, _ = await cp.send_command(INSTANCE, "session.reset", reason="now")
        assert (await cp.wait_for_command_status(reset, timeout=30))["status"] == "completed"
        assert not started(cp, "run-2")


async def test_queue_true_with_nothing_active_starts_at_once(tmp_path: Path, drivers: list[Driver]) -> None:
    async with control_plane(tmp_path) as cp:
        start(tmp_path, cp.url, drivers)
        cid, _ = await cp.send_command(
            INSTANCE, "input.start", run_id="run-1", input={"text": "[[say:now]]"}, queue=True
        )
        assert (await cp.wait_for_command_status(cid, timeout=20))["status"] == "completed"
        assert terminals(cp, "run-1")[0]["payload"]["final_message_text"] == "now"
        assert all(not b.get("queued") for b in [cp.last_heartbeat(INSTANCE) or {}])


@pytest.mark.provider
@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_real_runtime_queue_cancel_and_a_driver_sigkill(
    tmp_path: Path, drivers: list[Driver], fakes: Fakes, runtime: str
) -> None:
    """The queue with each real runtime: held behind a streaming run, one cancelled while queued, the
    driver SIGKILLed, and the next process starts the one still held (after ending the active run)."""
    async with control_plane(tmp_path) as cp:
        d = Driver(tmp_path, runtimes.payload(runtime, tmp_path, cp.url, fakes))
        drivers.append(d)
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=90)
        await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": runtimes.SLOW})
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "message.delta" and e["run_id"] == "run-1", timeout=60)
        q2 = await queue(cp, "run-2", f"[[say:queued on {runtime}]]")
        q3 = await queue(cp, "run-3", "[[say:never]]")
        await queued_in_heartbeat(cp, ["run-2", "run-3"])
        cancel, _ = await cp.send_command(INSTANCE, "turn.cancel", run_id="run-3", reason="not this one")
        assert (await cp.wait_for_command_status(cancel, timeout=20))["result"]["phase"] == "queued"
        await queued_in_heartbeat(cp, ["run-2"])
        d.signal(signal.SIGKILL)
        await d.wait(10)
        await cp.wait_disconnected(INSTANCE)
        drivers.append(Driver(tmp_path, runtimes.payload(runtime, tmp_path, cp.url, fakes), name="driver-2"))
        failed = await wait_terminal(cp, "run-1", timeout=60)
        assert failed["payload"]["error"]["code"] == "driver.restarted"
        assert (await cp.wait_for_command_status(q2, timeout=90))["status"] == "completed"
        assert terminals(cp, "run-2")[0]["payload"]["final_message_text"] == f"queued on {runtime}"
        assert failed["seq"] < started(cp, "run-2")[0]["seq"]
        assert (await cp.wait_for_command_status(q3, timeout=10))["status"] == "cancelled"
        assert not started(cp, "run-3")
        for run_id in ("run-1", "run-2", "run-3"):
            assert len(terminals(cp, run_id)) == 1


@pytest.mark.provider
async def test_an_input_start_sent_on_seeing_the_terminal_is_not_refused(
    tmp_path: Path, drivers: list[Driver], fakes: Fakes
) -> None:
    """A control plane sends the next input as soon as it stores a run's terminal. The driver still
    finishes that run then (the terminal's receipt, the Claude session's checkpoint, §8.1), and used to
    refuse the input `driver.run_active` in that window (the dev chat's next line, under load). A run
    whose terminal is chosen is not active: the input waits its turn and runs."""
    async with control_plane(tmp_path) as cp:
        drivers.append(Driver(tmp_path, runtimes.payload("claude-agent-sdk", tmp_path, cp.url, fakes)))
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=90)
        # A long prompt makes the session file, and so the checkpoint after the run, big: the window wide.
        text = "[[say:one]] " + "x" * 2_000_000
        await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": text})
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "run.completed" and e["run_id"] == "run-1", timeout=90)
        cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-2", input={"text": "[[say:two]]"})
        status = await cp.wait_for_command_status(cid, timeout=90)
        assert status["status"] == "completed", status
        assert [e["kind"] for e in terminals(cp, "run-2")] == ["run.completed"]
