"""Claim 3, events are not duplicated or lost: faults on the link and in the receipts while the real
provider works, and a SIGKILL of the driver inside the group-commit window under a flood; each case
counts what the CP stored against what it received (its tap) and the history's structure.

The flood cases use the flood ACP agent (agent_lab/testing/agents/flood_acp_agent.py: a real ACP agent process that
numbers its steps, so a hole or a repeat is visible); the driver's event path is the same for every
runtime. What a SIGKILL can lose by design (admitted, not yet journaled: the group-commit window) is
reported as `lost_unjournaled`, never as `lossless_lost`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio
import msgspec

from agent_lab.evidence import checks
from agent_lab.evidence.report import Case, Claim, judged
from agent_lab.evidence.rig import Rig, Sandbox, descendants, reap
from agent_lab.testing import agents

TOOL = "[[shell:sleep 1; echo ev-tool-done]]"
# What can sit unread between the flood agent and the driver: the pipe (64 KiB on Linux) and the
# driver's stream reader buffer (64 KiB), over the bytes of one step on the ACP wire (a plan update and
# a message chunk, JSON-RPC framed: measured ~420 bytes; 300 keeps the bound generous).
PIPE_BYTES = 2 * 64 * 1024
ACP_STEP_BYTES = 300
FLOOD = agents.FLOOD


def _history(rig: Rig, instance: str) -> checks.Accounting:
    return checks.account(rig.tap.for_instance(instance), rig.cp.events(instance))


async def link_cut(rig: Rig, instance: str) -> dict[str, Any]:
    await rig.cp.send_command(instance, "input.start", run_id="run-cut", input={"text": TOOL})
    await rig.event(instance, lambda e: e["run_id"] == "run-cut" and e["kind"] == "tool.started")
    await rig.cp.close_link(instance, 1006)
    await rig.cp.wait_connected(instance, timeout=30)
    term = await rig.terminal(instance, "run-cut")
    return {"run": checks.run_outcome(term)}


async def receipts(rig: Rig, instance: str, run_id: str, knobs: dict[str, Any]) -> dict[str, Any]:
    """Turn the knobs on for one run; release them once its terminal reached the CP (received)."""
    rig.cp.faults.update(knobs)
    try:
        await rig.cp.send_command(instance, "input.start", run_id=run_id, input={"text": TOOL})
        with anyio.fail_after(60):
            while not any(  # noqa: ASYNC110 (the tap has no event to wait on; bounded poll)
                e.get("run_id") == run_id and e["kind"] in checks.TERMINALS for e in rig.tap.for_instance(instance)
            ):
                await anyio.sleep(0.05)
    finally:
        rig.cp.faults.reset()
    term = await rig.terminal(instance, run_id, timeout=60)
    return {"run": checks.run_outcome(term)}


async def command_replayed(rig: Rig, instance: str) -> dict[str, Any]:
    cid, _ = await rig.cp.send_command(instance, "input.start", run_id="run-replay", input={"text": "[[say:once]]"})
    await rig.terminal(instance, "run-replay")
    await rig.cp.wait_for_command_status(cid, timeout=30)
    await rig.cp.resend_command(cid)
    await rig.cp.resend_command(cid)
    # The driver answers a replay with its latest status: wait for those two answers.
    await rig.cp.wait_until(lambda: len(rig.cp.command_updates(cid)) >= 4, timeout=20)
    starts = rig.cp.events(instance, kinds=["run.started"], run_id="run-replay")
    return {"command_sent_times": 3, "runs_started": len(starts)}


async def flood_sigkill(rig: Rig, base: Path) -> Case:
    instance = "drv-ev-events-flood"
    box = Sandbox(base / instance, instance).create()
    progress = box.state_dir / "flood-progress"  # where the agent can write (box.root is the boot folder: hidden)
    cmd = [sys.executable, str(FLOOD)]
    env = {"FLOOD_PROGRESS_FILE": str(progress)}
    d = rig.start("acp", box, acp_command=cmd, acp_env=env)
    await rig.started(instance)
    await rig.cp.send_command(instance, "input.start", run_id="run-flood", input={"text": "[[flood:100000:0]]"})
    await rig.event(
        instance,
        lambda e: (
            e["run_id"] == "run-flood"
            and e["kind"] == "plan.updated"
            and checks.flood_steps([e]) != []
            and checks.flood_steps([e])[0] >= 300
        ),
    )
    tree = descendants(d.pid)
    d.kill_driver_only()
    reap(tree)
    emitted = int(progress.read_text().strip() or 0)
    rig.start("acp", box, name="driver2", acp_command=cmd, acp_env=env)
    await rig.started(instance, epoch=2)
    term = await rig.terminal(instance, "run-flood", timeout=60)
    drained = await rig.settle(instance, timeout=60)
    acc = _history(rig, instance)
    run_events = rig.cp.events(instance, run_id="run-flood")
    stored_steps = len(checks.flood_steps(run_events))
    from driver.queue.outbox import UNSYNCED_MAX_BYTES

    # The lossless bytes of a step as journaled (plan.updated, message.completed, message.started).
    lossless_bytes = sum(len(msgspec.json.encode(e)) for e in run_events if e.get("delivery") == "lossless")
    bound = checks.unjournaled_bound(
        lossless_bytes / max(stored_steps, 1), UNSYNCED_MAX_BYTES, PIPE_BYTES, ACP_STEP_BYTES
    )
    measured = {
        **acc.measured(),
        "steps_emitted_by_agent": emitted,
        "steps_stored": stored_steps,
        "lost_unjournaled": max(0, emitted - stored_steps),
        "lost_unjournaled_bound": bound,
        "run": checks.run_outcome(term),
        "outbox_drained": drained,
    }
    failures = acc.failures()
    if measured["run"] != "run.failed{driver.restarted}":
        failures.append(f"the killed run ended {measured['run']}")
    if measured["lost_unjournaled"] > bound:
        failures.append(f"lost_unjournaled {measured['lost_unjournaled']} exceeds its bound {bound}")
    return judged(
        "SIGKILL inside the group-commit window (flood)",
        measured,
        failures,
        "flood agent emitting as fast as it can; driver SIGKILLed after step 300 was stored; restarted on "
        "the same state_dir. lost_unjournaled = steps the agent wrote minus steps stored: admitted but "
        "not yet journaled, or still in the pipe (allowed by PROTOCOL §4.1's group commit); its bound = the "
        "outbox's unjournaled byte cap (4 MiB) over a step's lossless bytes, plus the pipe and reader "
        "buffers (128 KiB) over a step's ACP bytes; durable_prefix_per_epoch = no hole inside an epoch",
    )


async def collect(rig: Rig, runtime: str, **_: Any) -> Claim:
    claim = Claim("events", runtime)
    instance = f"drv-ev-events-{runtime}"
    box = rig.sandbox(instance)
    rig.start(runtime, box)
    try:
        await rig.started(instance)
    except Exception as exc:
        claim.cases.append(Case("driver start", "failed", {}, f"{type(exc).__name__}: {exc}"[:300]))
        return claim
    steps: list[tuple[str, str, Any]] = [
        ("link cut mid-stream", "TCP dropped (1006) while a shell tool ran", lambda: link_cut(rig, instance)),
        (
            "receipts withheld",
            "CP stored but answered nothing until the run's terminal arrived",
            lambda: receipts(rig, instance, "run-withheld", {"withhold_receipts": True}),
        ),
        (
            "receipts duplicated",
            "every receipt sent twice",
            lambda: receipts(rig, instance, "run-dup", {"duplicate_receipts": True}),
        ),
        (
            "partial receipts",
            "only the first event of each batch considered and receipted",
            lambda: receipts(rig, instance, "run-partial", {"partial_receipt_events": 1}),
        ),
        (
            "command replayed (same command_id)",
            "input.start resent twice after it completed",
            lambda: command_replayed(rig, instance),
        ),
    ]
    for name, done, step in steps:
        try:
            measured = await step()
            measured["outbox_drained"] = await rig.settle(instance)
            acc = _history(rig, instance)
            failures = acc.failures()
            if measured.get("run") not in (None, "run.completed"):
                failures.append(f"the run ended {measured['run']}")
            if not measured["outbox_drained"]:
                failures.append("the driver's outbox did not drain within 30 s")
            if measured.get("runs_started", 1) != 1:
                failures.append(f"a replayed command started {measured['runs_started']} runs")
            claim.cases.append(judged(name, {**measured, **acc.measured()}, failures, done))
        except Exception as exc:
            claim.cases.append(Case(name, "failed", {}, f"{type(exc).__name__}: {exc}"[:300]))
    try:
        claim.cases.append(await flood_sigkill(rig, rig.root))
    except Exception as exc:
        claim.cases.append(
            Case("SIGKILL inside the group-commit window (flood)", "failed", {}, f"{type(exc).__name__}: {exc}"[:300])
        )
    claim.notes.append(
        "persistence boundary: an event is safe once its group commit is fsync'd; a crash loses at "
        "most the admitted-not-journaled window (lost_unjournaled), reported apart from lossless_lost"
    )
    return claim
