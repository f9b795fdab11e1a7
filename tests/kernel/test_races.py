"""Races and reuse through the real driver process (issue 30, PROTOCOL §9 "Check and act are one step",
"Identities are not reused"): a burst of queued `input.start`s past the cap of 16, a reused `run_id`
(in one process and across a restart), and the bounds of `input.steer`.

The provider is our stubborn ACP agent (a real process, model-free, fast); what is under test is the
kernel's, the same for every runtime.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

from tests.integration.harness import INSTANCE, boot_payload, control_plane
from tests.kernel.support import Driver, terminals

SLOW = "[[slow]]"


def start(tmp: Path, url: str, drivers: list[Driver], name: str = "driver") -> Driver:
    d = Driver(tmp, boot_payload(tmp, url), name=name)
    drivers.append(d)
    return d


async def slow_run(cp: Any, run_id: str) -> str:
    cid, _ = await cp.send_command(INSTANCE, "input.start", run_id=run_id, input={"text": SLOW})
    await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "message.delta" and e["run_id"] == run_id, timeout=20)
    return cid


def final_status(cp: Any, command_id: str) -> dict[str, Any] | None:
    """The terminal command.update the driver sent for `command_id` (raw frames are not in the CP's store)."""
    done = [u for u in cp.command_updates(command_id) if u["status"] != "accepted"]
    return done[-1] if done else None


async def test_a_burst_of_24_queued_input_starts_holds_16_and_refuses_8(tmp_path: Path, drivers: list[Driver]) -> None:
    """The cap is taken before the first await (the journal write): a burst cannot all pass the check."""
    async with control_plane(tmp_path) as cp:
        start(tmp_path, cp.url, drivers)
        await slow_run(cp, "run-0")
        ids = [f"cmd-burst-{i}" for i in range(24)]
        # One write per frame, back to back: the driver reads them faster than it journals one.
        for i, cid in enumerate(ids):
            frame = {
                "type": "command",
                "command_id": cid,
                "seq": 10_000 + i,
                "kind": "input.start",
                "run_id": f"q-{i}",
                "input": {"text": "hi"},
                "queue": True,
            }
            await cp.send_raw(INSTANCE, json.dumps(frame))
        await cp.wait_until(lambda: sum(final_status(cp, c) is not None for c in ids) >= 8, timeout=30)
        refused = [c for c in ids if final_status(cp, c) is not None]
        assert len(refused) == 8, [final_status(cp, c) for c in refused]
        for c in refused:
            status = final_status(cp, c)
            assert status is not None and status["status"] == "failed"
            assert status["error"]["code"] == "driver.queue_full" and status["error"]["retryable"] is True
        # The 16 held are the first 16 (held in seq order), and the heartbeat lists exactly them.
        beat = await cp.wait_for(
            INSTANCE, lambda i: i["type"] == "heartbeat" and len(i.get("queued") or []) == 16, timeout=10
        )
        assert beat["queued"] == [f"q-{i}" for i in range(16)]
        assert refused == ids[16:]


async def test_a_reused_run_id_is_refused_run_duplicate_while_active_queued_and_after(
    tmp_path: Path, drivers: list[Driver]
) -> None:
    async with control_plane(tmp_path) as cp:
        start(tmp_path, cp.url, drivers)
        slow = await slow_run(cp, "run-1")
        # While it runs: a queued input.start under the same run_id.
        again, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": "hi"}, queue=True)
        status = await cp.wait_for_command_status(again, timeout=10)
        assert status["status"] == "failed" and status["error"]["code"] == "run.duplicate", status
        assert status["error"]["retryable"] is False
        # While it is held: the same queued run_id twice.
        held, _ = await cp.send_command(
            INSTANCE, "input.start", run_id="run-2", input={"text": "[[say:two]]"}, queue=True
        )
        await cp.wait_for_command_status(held, "accepted", timeout=10)
        twice, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-2", input={"text": "hi"}, queue=True)
        status = await cp.wait_for_command_status(twice, timeout=10)
        assert status["error"]["code"] == "run.duplicate", status
        await cp.send_command(INSTANCE, "turn.cancel", run_id="run-1", reason="next")
        assert (await cp.wait_for_command_status(slow, timeout=20))["status"] == "cancelled"
        assert (await cp.wait_for_command_status(held, timeout=20))["status"] == "completed"
        # After both ended: each run_id once more, plain and queued.
        for run_id in ("run-1", "run-2"):
            late, _ = await cp.send_command(INSTANCE, "input.start", run_id=run_id, input={"text": "hi"})
            status = await cp.wait_for_command_status(late, timeout=10)
            assert status["error"]["code"] == "run.duplicate", status
        # One run id, one run, one terminal.
        for run_id in ("run-1", "run-2"):
            assert len(terminals(cp, run_id)) == 1
            started = [e for e in cp.events(INSTANCE, run_id=run_id) if e["kind"] == "run.started"]
            assert len(started) == 1
        # A fresh id still runs.
        fresh, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-3", input={"text": "[[say:ok]]"})
        assert (await cp.wait_for_command_status(fresh, timeout=20))["status"] == "completed"


async def test_a_run_id_is_still_known_after_a_driver_restart(tmp_path: Path, drivers: list[Driver]) -> None:
    async with control_plane(tmp_path) as cp:
        d = start(tmp_path, cp.url, drivers)
        done, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": "[[say:one]]"})
        assert (await cp.wait_for_command_status(done, timeout=20))["status"] == "completed"
        await slow_run(cp, "run-2")
        d.signal(signal.SIGKILL)
        await d.wait(10)
        start(tmp_path, cp.url, drivers, name="driver2")
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "run.failed" and e["run_id"] == "run-2", timeout=30)
        for run_id in ("run-1", "run-2"):
            again, _ = await cp.send_command(INSTANCE, "input.start", run_id=run_id, input={"text": "hi"})
            status = await cp.wait_for_command_status(again, timeout=20)
            assert status["status"] == "failed" and status["error"]["code"] == "run.duplicate", status
            assert len(terminals(cp, run_id)) == 1


async def test_a_command_whose_seq_is_outside_int64_is_answered_command_invalid(
    tmp_path: Path, drivers: list[Driver]
) -> None:
    """Its command_id is readable, so it is answered (PROTOCOL §3, §9), and the driver carries on."""
    async with control_plane(tmp_path) as cp:
        start(tmp_path, cp.url, drivers)
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=20)
        seqs = {f"cmd-seq-{i}": seq for i, seq in enumerate((2**63, 2**64, 10**30, -(2**70)))}
        for cid, seq in seqs.items():
            frame = {"type": "command", "command_id": cid, "seq": seq, "kind": "turn.cancel", "run_id": "r"}
            await cp.send_raw(INSTANCE, json.dumps(frame))
        await cp.wait_until(lambda: all(final_status(cp, c) is not None for c in seqs), timeout=15)
        for cid in seqs:
            status = final_status(cp, cid)
            assert status is not None and status["status"] == "failed", status
            assert status["error"]["code"] == "command.invalid" and "seq" in status["error"]["message"]
        done, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": "[[say:ok]]"})
        assert (await cp.wait_for_command_status(done, timeout=20))["status"] == "completed"


async def test_steers_are_bounded_in_size_and_in_number_pending(tmp_path: Path, drivers: list[Driver]) -> None:
    """A follow-up steer (ACP) waits for the current turn to end: while `[[slow]]` runs, 8 are held and
    the next is refused `steer.too_many` (retryable); a text over 256 KiB is `steer.too_large`."""
    async with control_plane(tmp_path) as cp:
        start(tmp_path, cp.url, drivers)
        run = await slow_run(cp, "run-s")
        big, _ = await cp.send_command(INSTANCE, "input.steer", run_id="run-s", input={"text": "x" * (256 * 1024 + 1)})
        status = await cp.wait_for_command_status(big, timeout=10)
        assert status["status"] == "failed" and status["error"]["code"] == "steer.too_large", status
        held = []
        for i in range(8):
            cid, _ = await cp.send_command(INSTANCE, "input.steer", run_id="run-s", input={"text": f"steer {i}"})
            held.append(cid)
        # Each is on its way (accepted, not terminal) before the ninth arrives.
        for cid in held:
            await cp.wait_for_command_status(cid, "accepted", timeout=10)
        ninth, _ = await cp.send_command(INSTANCE, "input.steer", run_id="run-s", input={"text": "one too many"})
        status = await cp.wait_for_command_status(ninth, timeout=10)
        assert status["status"] == "failed" and status["error"]["code"] == "steer.too_many", status
        assert status["error"]["retryable"] is True
        assert all(final_status(cp, c) is None for c in held)
        await cp.send_command(INSTANCE, "turn.cancel", run_id="run-s", reason="done")
        for cid in held:
            assert (await cp.wait_for_command_status(cid, timeout=20))["status"] == "cancelled"
        assert (await cp.wait_for_command_status(run, timeout=20))["status"] == "cancelled"
