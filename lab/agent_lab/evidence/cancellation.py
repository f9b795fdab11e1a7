"""Claim 5, cancellation completed: which cooperation stopped each run and how long it took, and what a
cancelled turn left behind (PROTOCOL §5 `run.cancelled{tool_calls, side_effects}`), checked against
what the evidence run saw happen: the files the tool wrote, the child process it left running.
"""

from __future__ import annotations

import os
import secrets
import shlex
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio

from agent_lab.evidence import checks
from agent_lab.evidence.report import Case, Claim, judged
from agent_lab.evidence.rig import Event, Rig, alive, reap

SLOW = "[[slow]]"


def find_processes(argv: list[str]) -> list[int]:
    """Live processes whose command line is exactly `argv` (our marker child, wherever it went)."""
    want = "\0".join(argv).encode() + b"\0"
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if Path(f"/proc/{entry}/cmdline").read_bytes() == want and alive(int(entry)):
                    out.append(int(entry))
            except OSError:
                continue
    return out


async def _until(condition: Any, timeout: float) -> bool:
    """Poll a file-system condition (no event announces a file a tool wrote) until it holds."""
    with anyio.move_on_after(timeout):
        while not condition():  # noqa: ASYNC110 (a file a tool wrote announces nothing: bounded poll)
            await anyio.sleep(0.05)
        return True
    return False


def _delta_of(run_id: str) -> Callable[[Event], bool]:
    return lambda e: e["run_id"] == run_id and e["kind"] == "message.delta"


async def streaming(rig: Rig, runtime: str, instance: str, n: int) -> Case:
    times: list[float] = []
    phases: dict[str, int] = {}
    outcomes: list[str] = []
    for i in range(n):
        run_id = f"run-c{i}"
        await rig.cp.send_command(instance, "input.start", run_id=run_id, input={"text": SLOW})
        await rig.event(instance, _delta_of(run_id))
        t0 = time.perf_counter()
        await rig.cp.send_command(instance, "turn.cancel", run_id=run_id, reason="evidence")
        term = await rig.terminal(instance, run_id, timeout=30)
        times.append((time.perf_counter() - t0) * 1000)
        outcomes.append(term["kind"])
        phase = str((term["payload"].get("details") or {}).get("phase", "?"))
        phases[phase] = phases.get(phase, 0) + 1
    measured = {"runs": n, **checks.summary_ms(times), "phases": phases}
    failures = [f"a cancelled run ended {k}" for k in outcomes if k != "run.cancelled"]
    return judged(
        "cancel while streaming",
        measured,
        failures,
        "turn.cancel sent once text streams; timed to run.cancelled stored by the CP",
    )


async def with_side_effects(rig: Rig, runtime: str, instance: str) -> Case:
    box = rig.root / instance / "cwd"
    marker = ["sleep", f"{300 + secrets.randbelow(600)}.{secrets.randbelow(1000):03d}"]
    script = f"echo a > ev-a.txt; echo b > ev-b.txt; {shlex.join(marker)} & sleep 30"
    run_id = "run-side"
    try:
        await rig.cp.send_command(instance, "input.start", run_id=run_id, input={"text": f"[[shell:{script}]]"})
        await rig.event(instance, lambda e: e["run_id"] == run_id and e["kind"] == "tool.started")
        started = await _until(lambda: (box / "ev-b.txt").exists() and find_processes(marker), 30)
        await rig.cp.send_command(instance, "turn.cancel", run_id=run_id, reason="evidence")
        term = await rig.terminal(instance, run_id, timeout=30)
        left = find_processes(marker)
        payload = term["payload"] if term["kind"] == "run.cancelled" else None
        measured: dict[str, Any] = {
            "tool_was_running": started,
            "phase": (term["payload"].get("details") or {}).get("phase"),
            "tool_calls": term["payload"].get("tool_calls"),
            "side_effects": term["payload"].get("side_effects"),
            "actual_files_changed": ["ev-a.txt", "ev-b.txt"],
            "actual_processes_left": [{"pid": p, "argv0": "sleep"} for p in left],
        }
        failures = [] if started else ["the tool never wrote its files or started its child"]
        failures += checks.judge_side_effects(payload, ["ev-a.txt", "ev-b.txt"], left)
        return judged(
            "cancel while a tool writes files and runs a child",
            measured,
            failures,
            f"shell tool: two files written, `{shlex.join(marker)} &` left running, then turn.cancel",
        )
    finally:
        reap(find_processes(marker))


async def collect(rig: Rig, runtime: str, *, quick: bool = False, **_: Any) -> Claim:
    claim = Claim("cancellation", runtime)
    instance = f"drv-ev-cancel-{runtime}"
    box = rig.sandbox(instance)
    rig.start(runtime, box)
    try:
        await rig.started(instance)
    except Exception as exc:
        claim.cases.append(Case("driver start", "failed", {}, f"{type(exc).__name__}: {exc}"[:300]))
        return claim
    steps: list[tuple[str, Callable[[], Awaitable[Case]]]] = [
        ("cancel while streaming", lambda: streaming(rig, runtime, instance, 3 if quick else 10)),
        ("cancel while a tool writes files and runs a child", lambda: with_side_effects(rig, runtime, instance)),
    ]
    for name, step in steps:
        try:
            claim.cases.append(await step())
        except Exception as exc:
            claim.cases.append(Case(name, "failed", {}, f"{type(exc).__name__}: {exc}"[:300]))
    claim.notes.append("tool side effects are not rolled back: run.cancelled reports them (PROTOCOL §5)")
    return claim
