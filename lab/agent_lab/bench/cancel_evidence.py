"""Evidence for cancellation and supervision, through the real driver process and the reference
control plane, per runtime (run with `python -m agent_lab.bench.cancel_evidence [--runs N] [--only NAME ...]`):

- cancel → receipt: from sending `turn.cancel` (the run streaming) to the control plane having stored
  `run.cancelled`, p50/p95 over N runs, and which phase ended each run (interrupt/terminate/kill);
- crash → run.failed: from SIGKILL of the provider's process group mid-stream to `run.failed` stored;
- crash → ready: from that SIGKILL to the `provider.restarted` diagnostic stored (ready for the next run).

The real runtimes (Claude Code CLI, Codex app-server, codex-acp) run offline against the fake model
endpoints. Two rows use our stubborn ACP agent, which ignores the interrupt (and SIGTERM), with the
grace periods shortened to 500 ms each (AGENT_DRIVER_CANCEL_GRACE_MS / AGENT_DRIVER_TERM_GRACE_MS),
to show the escalation phases; the real runtimes use the default 5 s + 3 s bounds and never need them.
It runs on the evidence rig (agent_lab.bench._driven), so an install of the lab runs it too.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from agent_lab.bench import _driven
from agent_lab.bench._driven import INSTANCE, SLOW, provider_pid
from agent_lab.evidence.rig import TERMINALS, rig
from agent_lab.testing.fakes import Fakes
from driver import logs

SHORT_GRACE = {"AGENT_DRIVER_CANCEL_GRACE_MS": "500", "AGENT_DRIVER_TERM_GRACE_MS": "500"}


@dataclass(frozen=True)
class Case:
    name: str
    runtime: str
    mode: str = "normal"
    env: dict[str, str] = field(default_factory=dict)


CASES = (
    Case("claude-agent-sdk", "claude-agent-sdk"),
    Case("openai-app-server", "openai-app-server"),
    Case("acp: codex-acp", "acp:codex-acp"),
    Case("acp: stubborn ignore-cancel*", "acp:stubborn", "ignore-cancel", SHORT_GRACE),
    Case("acp: stubborn ignore-term*", "acp:stubborn", "ignore-term", SHORT_GRACE),
)


@dataclass
class Row:
    case: Case
    cancel_ms: list[float] = field(default_factory=list)
    phases: dict[str, int] = field(default_factory=dict)
    crash_failed_ms: list[float] = field(default_factory=list)
    crash_ready_ms: list[float] = field(default_factory=list)
    error: str = ""


def percentile(values: list[float], q: float) -> float:
    if len(values) == 1:
        return values[0]
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return cuts[round(q * 100) - 1]


Event = dict[str, Any]


def terminal_of(run_id: str) -> Callable[[Event], bool]:
    return lambda e: e["run_id"] == run_id and e["kind"] in TERMINALS


def restarted_after(seq: int) -> Callable[[Event], bool]:
    return lambda e: (
        e["seq"] > seq and e["kind"] == "diagnostic.reported" and e["payload"]["code"] == "provider.restarted"
    )


async def wait_delta(cp: Any, run_id: str) -> None:
    await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "message.delta" and e["run_id"] == run_id, timeout=60)


async def measure(case: Case, runs: int, crashes: int, fakes: Fakes) -> Row:
    row = Row(case)
    with tempfile.TemporaryDirectory(prefix="cancel-evidence-") as tmp_name:
        tmp = Path(tmp_name)
        # Closing the rig stops the driver: SIGTERM, then SIGKILL of what is left after 20 s.
        async with rig(tmp, fakes) as r:
            cp = r.cp
            driver = _driven.start(r, case.runtime, mode=case.mode, env=case.env)
            try:
                await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=90)
                for i in range(runs):
                    run_id = f"c-{i}"
                    input_cid, _ = await cp.send_command(INSTANCE, "input.start", run_id=run_id, input={"text": SLOW})
                    await wait_delta(cp, run_id)
                    t0 = time.perf_counter()
                    await cp.send_command(INSTANCE, "turn.cancel", run_id=run_id, reason="bench")
                    terminal = await cp.wait_for_event(INSTANCE, terminal_of(run_id), timeout=30)
                    row.cancel_ms.append((time.perf_counter() - t0) * 1000)
                    phase = (terminal["payload"].get("details") or {}).get("phase", terminal["kind"])
                    row.phases[phase] = row.phases.get(phase, 0) + 1
                    await cp.wait_for_command_status(input_cid, timeout=30)
                    if phase in ("terminate", "kill"):
                        await cp.wait_for_event(
                            INSTANCE,
                            restarted_after(terminal["seq"]),
                            timeout=60,
                        )
                for i in range(crashes):
                    run_id = f"k-{i}"
                    await cp.send_command(INSTANCE, "input.start", run_id=run_id, input={"text": SLOW})
                    await wait_delta(cp, run_id)
                    pgid = await provider_pid(driver)
                    t0 = time.perf_counter()
                    os.killpg(pgid, signal.SIGKILL)
                    failed = await cp.wait_for_event(INSTANCE, terminal_of(run_id), timeout=30)
                    row.crash_failed_ms.append((time.perf_counter() - t0) * 1000)
                    if failed["kind"] != "run.failed":
                        row.error = f"crash ended the run as {failed['kind']}"
                    await cp.wait_for_event(
                        INSTANCE,
                        restarted_after(failed["seq"]),
                        timeout=90,
                    )
                    row.crash_ready_ms.append((time.perf_counter() - t0) * 1000)
            except TimeoutError:
                row.error = "timed out; driver stderr tail: " + driver.log()[-300:].replace("\n", " | ")
    return row


def report(rows: list[Row], runs: int) -> None:
    header = (
        "runtime",
        "runs",
        "cancel→run.cancelled p50 ms",
        "p95 ms",
        "phase reached",
        "crash→run.failed ms",
        "crash→ready ms (1st)",
        "later crashes→ready (backoff)",
    )
    lines = [header]
    for r in rows:
        if r.error and not r.cancel_ms:
            lines.append((r.case.name, "0", "-", "-", "-", "-", "-", r.error[:60]))
            continue
        phases = ", ".join(f"{k} x{v}" for k, v in sorted(r.phases.items()))
        crash_failed = f"{statistics.median(r.crash_failed_ms):.0f}" if r.crash_failed_ms else "-"
        crash_ready = f"{r.crash_ready_ms[0]:.0f}" if r.crash_ready_ms else "-"
        later = " / ".join(f"{v:.0f}" for v in r.crash_ready_ms[1:]) or "-"
        lines.append(
            (
                r.case.name,
                str(len(r.cancel_ms)),
                f"{percentile(r.cancel_ms, 0.5):.0f}",
                f"{percentile(r.cancel_ms, 0.95):.0f}",
                phases,
                crash_failed,
                crash_ready,
                later,
            )
        )
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(header))]
    print()
    for n, line in enumerate(lines):
        print("| " + " | ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)) + " |")
        if n == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    print()
    print(
        f"cancel: {runs} runs each, timed from sending turn.cancel while the run streams to run.cancelled stored "
        "by the control plane (its receipt). crash: SIGKILL of the provider's process group mid-stream, to "
        "run.failed stored (median) and to provider.restarted stored; the first restart after a crash is "
        "immediate, later ones inside the crash window back off 1 s, 2 s, 4 s... "
        "* grace periods shortened to 500 ms + 500 ms (defaults 5 s + 3 s)."
    )
    for r in rows:
        if r.error:
            print(f"note: {r.case.name}: {r.error}")


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m agent_lab.bench.cancel_evidence", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--runs", type=int, default=20, help="cancels per runtime (default 20)")
    parser.add_argument("--crashes", type=int, default=3, help="provider kills per runtime (default 3)")
    parser.add_argument("--only", nargs="*", default=None, help="case names containing any of these words")
    args = parser.parse_args(argv)
    # Only the table on stdout: the control plane's info logs go nowhere.
    logs.configure("warning")
    cases = [c for c in CASES if not args.only or any(w in c.name for w in args.only)]
    rows: list[Row] = []
    started = time.perf_counter()
    with ExitStack() as stack:
        fakes = Fakes(stack)
        for case in cases:
            t0 = time.perf_counter()
            rows.append(await measure(case, args.runs, args.crashes, fakes))
            print(f"  {case.name}: {time.perf_counter() - t0:.1f} s", flush=True)
    report(rows, args.runs)
    print(f"total {time.perf_counter() - started:.0f} s")
    return 1 if any(r.error for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(anyio.run(main))
