"""Figures of native checkpoints (PROTOCOL §8.1), per runtime, through the real driver, the real
provider runtimes (offline, against the fake model endpoints) and the reference control plane:

- checkpoint bytes per run over a 10-turn session (what each run's checkpoint sent, and the session's size);
- time from each run's terminal (`occurred_at`, the driver's clock) to its `checkpoint.recorded` being
  stored by the control plane (`stored_at`: the receipt follows that commit), same host, same clock;
- the restore in a brand-new sandbox (the driver's `checkpoint.restored` ms) and its provider start,
  beside a plain start of the same runtime in another brand-new sandbox.

    python -m agent_lab.evidence.checkpoint_figures [--runtime R ...] [--turns 10] [--json FILE]
"""

from __future__ import annotations

import argparse
import base64
import json
import statistics
import sys
import tempfile
from collections import defaultdict
from collections.abc import Callable
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path
from typing import Any

from agent_lab.evidence.rig import Rig, rig
from agent_lab.testing.fakes import Fakes

RUNTIMES = ("claude-agent-sdk", "openai-app-server", "acp")  # acp: codex-acp, as in the evidence command


def _at(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _recorded_after(run_id: str) -> Callable[[dict[str, Any]], bool]:
    return lambda e: e["kind"] == "checkpoint.recorded" and e["payload"]["run_id"] == run_id


async def _session(r: Rig, runtime: str, turns: int) -> dict[str, Any]:
    box = r.sandbox(f"drv-fig-{runtime}", "cattle")
    r.start(runtime, box)
    await r.started(box.instance)
    for i in range(1, turns + 1):
        await r.turn(box.instance, f"run-{i}", f"[[say:ok {i}]] turn {i}: remember fig-word-{i}")
        await r.event(box.instance, _recorded_after(f"run-{i}"))
    events = r.cp.events(box.instance)
    sent: dict[str, int] = defaultdict(int)
    for e in events:
        if e["kind"] == "checkpoint.file":
            sent[e["payload"]["checkpoint_id"]] += len(base64.b64decode(e["payload"]["data_b64"]))
    terminals = {e["run_id"]: e for e in events if e["kind"] == "run.completed"}
    per_run = []
    for e in events:
        if e["kind"] != "checkpoint.recorded":
            continue
        p = e["payload"]
        term = terminals.get(p["run_id"])
        per_run.append(
            {
                "run_id": p["run_id"],
                "sent_bytes": sent[p["checkpoint_id"]],
                "session_bytes": sum(f["size"] for f in p["files"]),
                "terminal_to_stored_ms": None
                if term is None
                else round((_at(e["stored_at"]) - _at(term["occurred_at"])) * 1000, 1),
            }
        )
    checkpoint = r.cp.native_checkpoint(box.instance, r.root / "served")
    for d in list(r.drivers):
        await d.stop()
    r.drivers.clear()
    return {"instance": box.instance, "per_run": per_run, "checkpoint": checkpoint}


async def _boot(r: Rig, runtime: str, instance: str, checkpoint: dict[str, Any] | None) -> dict[str, Any]:
    box = r.sandbox(instance, "cattle")
    r.start(runtime, box, native_checkpoint=checkpoint)
    started = await r.started(instance)
    timings = {
        e["payload"]["phase"]: e["payload"]["ms"]
        for e in r.cp.events(instance, kinds=["runtime.timing.recorded"])
        if e["payload"].get("run_id") is None
    }
    restored = [
        e["payload"]["details"]
        for e in r.cp.events(instance, kinds=["diagnostic.reported"])
        if e["payload"]["code"] == "checkpoint.restored"
    ]
    resets = r.cp.events(instance, kinds=["runtime.session.reset"])
    for d in list(r.drivers):
        await d.stop()
    r.drivers.clear()
    return {
        "restore_ms": restored[0]["ms"] if restored else None,
        "provider_start_ms": started["payload"]["timings"]["provider_start_ms"],
        "boot_ms": started["payload"]["timings"]["boot_ms"],
        "provider_ready_ms": timings.get("provider.ready"),
        "reset": bool(resets),
    }


async def figures(runtime: str, turns: int) -> dict[str, Any]:
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="ckpt-fig-") as tmp:
        fakes = Fakes(stack)
        async with rig(Path(tmp), fakes) as r:
            session = await _session(r, runtime, turns)
            resumed = await _boot(r, runtime, f"drv-fig-{runtime}-restored", session["checkpoint"])
            plain = await _boot(r, runtime, f"drv-fig-{runtime}-plain", None)
    per_run = session["per_run"]
    latencies = [p["terminal_to_stored_ms"] for p in per_run if p["terminal_to_stored_ms"] is not None]
    return {
        "runtime": runtime,
        "turns": turns,
        "per_run": per_run,
        "sent_bytes_total": sum(p["sent_bytes"] for p in per_run),
        "session_bytes_final": per_run[-1]["session_bytes"] if per_run else None,
        "terminal_to_stored_ms_median": statistics.median(latencies) if latencies else None,
        "terminal_to_stored_ms_max": max(latencies) if latencies else None,
        "restored_start": resumed,
        "plain_start": plain,
    }


def main(argv: list[str] | None = None) -> int:
    import anyio

    p = argparse.ArgumentParser(prog="python -m agent_lab.evidence.checkpoint_figures")
    p.add_argument("--runtime", action="append", choices=RUNTIMES)
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    out = [anyio.run(figures, runtime, args.turns) for runtime in (args.runtime or RUNTIMES)]
    text = json.dumps(out, indent=2)
    if args.json:
        args.json.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
