"""Claim 1, the agent can resume: PROTOCOL §8's matrix, measured per runtime.

Each case runs on its own instance: a seed turn that gives the model a code word, marker files in
`cwd` and `memory_dir`, then a run in flight that is hit by the failure, then one more turn. Measured:
lossless events lost / stored twice (the CP's tap against its store, plus the history's structure),
the in-flight run's outcome, whether the next model request carried the code word (the native session,
or the replayed transcript, came back), which marker files exist, what was replayed.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from agent_lab.evidence import checks
from agent_lab.evidence.report import Case, Claim, judged, not_measured
from agent_lab.evidence.rig import DriverProc, Rig, Sandbox, descendants, pgid_of, reap, wait_gone

SLOW = "[[slow]]"
LINK_TOOL = "[[shell:sleep 2; echo link-ok]]"

# PROTOCOL §8: what each failure must leave (fields judged against the measured values).
EXPECTED: dict[str, dict[str, Any]] = {
    "link lost": {
        "run_in_flight": "run.completed",
        "native_session": "resumed",
        "files_kept": True,
        "memory_kept": True,
    },
    "provider killed": {
        "run_in_flight": "run.failed{provider.crashed}",
        "native_session": "resumed",
        "files_kept": True,
        "memory_kept": True,
    },
    "driver killed": {
        "run_in_flight": "run.failed{driver.restarted}",
        "native_session": "resumed",
        "files_kept": True,
        "memory_kept": True,
        "provider_processes_left": 0,
    },
    # PROTOCOL §8.2: with reattach_grace_ms, the run in flight continues under the new driver process.
    "driver killed (reattach)": {
        "run_in_flight": "run.completed",
        "native_session": "resumed",
        "files_kept": True,
        "memory_kept": True,
        "text_whole": True,
        "same_provider": True,
        "model_requests_during_reattach": 0,
    },
    # §8.1: the native session comes back from the last checkpoint, not as a replayed transcript.
    "sandbox lost (cattle)": {"native_session": "resumed", "restored_from": "checkpoint", "files_kept": False},
    "sandbox lost (pet, memory_dir kept)": {
        "native_session": "resumed",
        "restored_from": "checkpoint",
        "files_kept": False,
        "memory_kept": True,
    },
}


@dataclass
class Story:
    """One case's instances and words."""

    rig: Rig
    runtime: str
    case: str
    box: Sandbox
    word: str  # the seed turn's code word

    @property
    def instance(self) -> str:
        return self.box.instance


async def seed(rig: Rig, runtime: str, box: Sandbox, word: str, **kw: Any) -> DriverProc:
    d = rig.start(runtime, box, **kw)
    await rig.started(box.instance)
    await rig.turn(box.instance, "run-seed", f"[[say:noted]] remember the code word {word}")
    (box.cwd / "evidence-kept.txt").write_text(word)
    if box.memory_dir is not None:
        (box.memory_dir / "evidence-memory.txt").write_text(word)
    return d


async def in_flight(rig: Rig, instance: str, text: str = SLOW) -> None:
    """Start the run the failure hits, and wait until it is visibly under way."""
    await rig.cp.send_command(instance, "input.start", run_id="run-hit", input={"text": text})
    if text == SLOW:
        await rig.event(instance, lambda e: e["run_id"] == "run-hit" and e["kind"] == "message.delta")
    else:
        await rig.event(instance, lambda e: e["run_id"] == "run-hit" and e["kind"] == "tool.started")


async def after_turn(rig: Rig, runtime: str, instance: str, word: str) -> dict[str, Any]:
    """One more turn; did the model's request carry the earlier code word?"""
    before = len(rig.fakes.requests(runtime))
    probe = "after-" + secrets.token_hex(4)
    term = await rig.turn(instance, "run-after", f"[[say:back]] {probe}")
    drained = await rig.settle(instance)
    asked = [r for r in rig.fakes.requests(runtime)[before:] if probe in str(r)]
    earlier = any(word in str(r) for r in asked) if asked else None
    return {"next_turn": checks.run_outcome(term), "earlier_in_next_request": earlier, "outbox_drained": drained}


def _measure(
    rig: Rig, story: Story, run_instance: str, after: dict[str, Any], box_after: Sandbox, open_ok: set[str]
) -> dict[str, Any]:
    stored = rig.cp.events(story.instance) + (rig.cp.events(box_after.instance) if box_after is not story.box else [])
    received = rig.tap.for_instance(story.instance) + (
        rig.tap.for_instance(box_after.instance) if box_after is not story.box else []
    )
    acc = checks.account(received, stored, open_runs_ok=open_ok)
    hit = [e for e in rig.cp.events(run_instance, run_id="run-hit") if e["kind"] in checks.TERMINALS]
    resets = rig.cp.events(box_after.instance, kinds=["runtime.session.reset"])
    memory = box_after.memory_dir
    return {
        **acc.measured(),
        "run_in_flight": checks.run_outcome(hit[0] if hit else None),
        "native_session": checks.native_session(bool(resets), after["earlier_in_next_request"]),
        "next_turn": after["next_turn"],
        "outbox_drained": after["outbox_drained"],
        "files_kept": (box_after.cwd / "evidence-kept.txt").exists(),
        "memory_kept": None if memory is None else (memory / "evidence-memory.txt").exists(),
        "_failures": acc.failures(),
    }


def _case(name: str, measured: dict[str, Any], done: str) -> Case:
    failures = measured.pop("_failures") + checks.judge_resume(measured, EXPECTED[name])
    if measured.get("outbox_drained") is False:
        failures.append("the driver's outbox did not drain within 30 s")
    if measured.get("next_turn") != "run.completed":
        failures.append(f"the turn after the failure ended {measured.get('next_turn')}")
    return judged(name, {k: v for k, v in measured.items() if v is not None}, failures, done)


async def link_lost(rig: Rig, runtime: str, s: Story) -> Case:
    await seed(rig, runtime, s.box, s.word)
    await in_flight(rig, s.instance, LINK_TOOL)
    await rig.cp.close_link(s.instance, 1006)
    await rig.cp.wait_connected(s.instance, timeout=30)
    await rig.terminal(s.instance, "run-hit", timeout=60)
    after = await after_turn(rig, runtime, s.instance, s.word)
    m = _measure(rig, s, s.instance, after, s.box, set())
    m["reconnects"] = len(rig.cp.link_history(s.instance))
    return _case(s.case, m, "TCP dropped (1006) while a shell tool ran; waited for the reconnect")


async def provider_killed(rig: Rig, runtime: str, s: Story) -> Case:
    d = await seed(rig, runtime, s.box, s.word)
    await in_flight(rig, s.instance)
    groups = {pgid_of(p) for p in descendants(d.pid)} - {pgid_of(d.pid)}
    pgids = [g for g in groups if g is not None]
    for pgid in pgids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    await rig.terminal(s.instance, "run-hit", timeout=60)
    after = await after_turn(rig, runtime, s.instance, s.word)
    m = _measure(rig, s, s.instance, after, s.box, set())
    return _case(s.case, m, f"SIGKILL of the provider's process group(s) ({len(pgids)}) mid-stream")


async def driver_killed(rig: Rig, runtime: str, s: Story) -> Case:
    d = await seed(rig, runtime, s.box, s.word)
    await in_flight(rig, s.instance)
    tree = descendants(d.pid)
    d.kill_driver_only()
    left = await wait_gone(tree, 6.0)  # PROTOCOL §8: nothing outlives its driver by more than 5 s
    reap(left)
    rig.start(runtime, s.box, name="driver2")
    await rig.started(s.instance, epoch=2)
    await rig.terminal(s.instance, "run-hit", timeout=60)
    after = await after_turn(rig, runtime, s.instance, s.word)
    m = _measure(rig, s, s.instance, after, s.box, set())
    m["provider_processes_left"] = len(left)
    m["replayed_events_of_epoch_1"] = sum(
        1 for e in rig.tap.for_instance(s.instance) if e.get("epoch") == 1 and e["received_at"] > _hello2(rig)
    )
    return _case(s.case, m, "SIGKILL of the driver process alone mid-stream; a new one on the same state_dir")


async def driver_killed_reattach(rig: Rig, runtime: str, s: Story) -> Case:
    from driver.protocol.capabilities import capabilities_of

    if "reattach" not in capabilities_of(runtime):
        return not_measured(s.case, f"{runtime} declares reattach unsupported (docs/protocol.md, the keeper)")
    grace = 30_000
    d = await seed(rig, runtime, s.box, s.word, reattach_grace_ms=grace)
    await in_flight(rig, s.instance)
    provider = kept_provider(rig, s)
    asked = len(rig.fakes.requests(runtime))
    d.kill_driver_only()
    t0 = time.monotonic()
    rig.start(runtime, s.box, name="driver2", reattach_grace_ms=grace)
    await rig.event(s.instance, lambda e: e["run_id"] == "run-hit" and e["epoch"] == 2)
    reattach_ms = round((time.monotonic() - t0) * 1000)
    term = await rig.terminal(s.instance, "run-hit", timeout=90)
    asked_again = len(rig.fakes.requests(runtime)) - asked
    same = bool(provider) and kept_provider(rig, s) == provider
    after = await after_turn(rig, runtime, s.instance, s.word)
    m = _measure(rig, s, s.instance, after, s.box, set())
    from agent_lab.testing.script import SLOW_TEXT

    m["text_whole"] = term["payload"].get("final_message_text", "").strip() == SLOW_TEXT
    m["same_provider"] = same
    m["model_requests_during_reattach"] = asked_again
    m["reattach_ms"] = reattach_ms
    return _case(
        s.case, m, "SIGKILL of the driver process alone mid-stream with reattach_grace_ms; a new one reattaches"
    )


def kept_provider(rig: Rig, s: Story) -> list[int]:
    """The pid of the provider the instance's keeper holds (empty when none is recorded and alive).
    The keeper's record is authenticated under the journal's key (docs/protocol.md, the keeper): it
    is read here as the driver reads it, under the key the driver derives from its token."""
    from driver.keeper import kept
    from driver.keeper import state as keeper_state
    from driver.queue.rowmac import UNKEYED, RowMac, derive_key

    keeper_state.use_mac(RowMac(derive_key(rig.token, s.instance)))
    try:
        record = kept.read_record(s.box.state_dir)
        return keeper_state.children(record.keeper_pid) if record is not None and record.alive() else []
    finally:
        keeper_state.use_mac(UNKEYED)


def _hello2(rig: Rig) -> float:
    later = [t for t, epoch in rig.tap.hellos if epoch == 2]
    return later[-1] if later else float("inf")


def recovery_from_store(rig: Rig, instance: str) -> tuple[dict[str, str] | None, list[dict[str, str]]]:
    """What a CP gives a new sandbox: the last `runtime.resume.updated` ref, and the transcript (the
    inputs it sent and the assistant messages it stored)."""
    refs = rig.cp.events(instance, kinds=["runtime.resume.updated"])
    ref = None if not refs else {"runtime": refs[-1]["payload"]["runtime"], "value": refs[-1]["payload"]["value"]}
    messages: list[dict[str, str]] = []
    runs = {c["body"].get("run_id"): c["body"] for c in rig.cp.commands(instance) if c["kind"] == "input.start"}
    for e in rig.cp.events(instance, kinds=["run.started", "message.completed"]):
        if e["kind"] == "run.started" and e["run_id"] in runs:
            messages.append({"role": "user", "text": runs[e["run_id"]]["input"]["text"]})
        elif e["kind"] == "message.completed" and e["payload"].get("role") == "assistant":
            messages.append({"role": "assistant", "text": e["payload"]["text"]})
    return ref, messages


async def sandbox_lost(rig: Rig, runtime: str, s: Story) -> Case:
    d = await seed(rig, runtime, s.box, s.word)
    # The seed run's checkpoint (§8.1) is complete once its checkpoint.recorded is stored.
    await rig.event(s.instance, lambda e: e["kind"] == "checkpoint.recorded" and e["payload"]["run_id"] == "run-seed")
    await in_flight(rig, s.instance)
    tree = descendants(d.pid)
    d.kill_driver_only()
    reap(tree)  # the whole sandbox is gone: every process in it
    ref, messages = recovery_from_store(rig, s.instance)
    checkpoint = rig.cp.native_checkpoint(s.instance, rig.root / f"{s.instance}-checkpoint")
    box2 = rig.sandbox(s.instance + "-new", s.box.kind, s.box.memory_dir)
    rig.start(runtime, box2, name="driver", native_resume=ref, recovery_messages=messages, native_checkpoint=checkpoint)
    await rig.started(box2.instance)
    after = await after_turn(rig, runtime, box2.instance, s.word)
    m = _measure(rig, s, s.instance, after, box2, {"run-hit"})
    m["native_resume_given"] = ref is not None
    m["recovery_messages_given"] = len(messages)
    m |= restore_measures(rig, box2.instance, checkpoint)
    return _case(
        s.case,
        m,
        "driver and provider SIGKILLed; a new instance on a fresh cwd/state_dir, booted with the CP's latest "
        "complete checkpoint (execution.native_checkpoint), its last runtime.resume.updated ref and transcript",
    )


def restore_measures(rig: Rig, instance: str, checkpoint: dict[str, Any] | None) -> dict[str, Any]:
    """Where the native session came from in the new sandbox, the checkpoint's size and the restore time
    (the driver's `checkpoint.restored` diagnostic), and the new provider's start beside it."""
    restored = [
        e["payload"]["details"]
        for e in rig.cp.events(instance, kinds=["diagnostic.reported"])
        if e["payload"]["code"] == "checkpoint.restored"
    ]
    started = rig.cp.events(instance, kinds=["driver.started"])
    timings = started[-1]["payload"]["timings"] if started else {}
    return {
        "restored_from": "checkpoint" if restored else ("none given" if checkpoint is None else "fallback"),
        "checkpoint_bytes": sum(f["size"] for f in checkpoint["files"]) if checkpoint else None,
        "checkpoint_files": len(checkpoint["files"]) if checkpoint else None,
        "restore_ms": restored[0]["ms"] if restored else None,
        "provider_start_ms": timings.get("provider_start_ms"),
    }


CASES: list[tuple[str, str, Callable[[Rig, str, Story], Awaitable[Case]]]] = [
    ("link lost", "pet", link_lost),
    ("provider killed", "pet", provider_killed),
    ("driver killed", "pet", driver_killed),
    ("driver killed (reattach)", "pet", driver_killed_reattach),
    ("sandbox lost (cattle)", "cattle", sandbox_lost),
    ("sandbox lost (pet, memory_dir kept)", "pet", sandbox_lost),
]


def last_error(rig: Rig, instance: str) -> str:
    """The driver's last error diagnostic, said with a case that could not finish: a bare timeout
    names what was waited for, not why it never came."""
    errors = [
        e["payload"]
        for e in rig.cp.events(instance, kinds=["diagnostic.reported"])
        if e["payload"].get("severity") == "error" and e["payload"].get("code") != "driver.log"
    ]
    return f"; the driver last reported {errors[-1]['code']}: {errors[-1]['message']}" if errors else ""


async def collect(rig: Rig, runtime: str, **_: Any) -> Claim:
    claim = Claim("resume", runtime)
    for n, (name, kind, fn) in enumerate(CASES):
        instance = f"drv-ev-resume-{runtime}-{n}"
        memory = rig.root / f"{instance}-memory" if kind == "pet" else None
        box = rig.sandbox(instance, kind, memory)
        story = Story(rig, runtime, name, box, "ev-word-" + secrets.token_hex(4))
        try:
            claim.cases.append(await fn(rig, runtime, story))
        except Exception as exc:  # a case that could not finish is a failed case, with why
            why = f"{type(exc).__name__}: {exc}".rstrip(": ") + last_error(rig, instance)
            claim.cases.append(Case(name, "failed", {}, why[:300]))
        finally:
            for d in list(rig.drivers):
                await d.stop()
            rig.drivers.clear()
    return claim
