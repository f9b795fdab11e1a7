"""Steer evidence (PROTOCOL §3.1), through the real driver process and the reference control plane, per
runtime (run with `python -m agent_lab.bench.steer [--runs N] [--only RUNTIME ...]`):

- steer → provider has it: from sending `input.steer` (the run streaming) to the control plane having
  stored `input.steered` (the driver emits it once the provider took the input);
- steer → model request: from sending `input.steer` to the fake model endpoint receiving a request
  that carries the steered text (when the model sees it: at once for Codex, which restarts the
  response; after the response under way for Claude Code; after the turn for ACP's follow-up);
- beside them, a fresh `input.start`'s time to first token: from sending it to the first
  `message.delta` stored, on the same runtime and driver.

The real runtimes (Claude Code CLI, Codex app-server, codex-acp) run offline against the fake model
endpoints; the run being steered streams for about 2 s (`[[slow:40]]`). p50/p95 over N runs.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from agent_lab.bench import _driven
from agent_lab.bench._common import percentile, table
from agent_lab.bench._driven import INSTANCE
from agent_lab.evidence.rig import TERMINALS, rig
from agent_lab.testing.fakes import Fakes
from driver import logs

STEERED_RUN = "[[slow:40]]"


class TimedList(list[Any]):
    """A fake's request list that also notes when each request arrived (appended on its HTTP thread)."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def append(self, item: Any) -> None:
        self.times.append(time.monotonic())
        super().append(item)

    def arrived(self, marker: str) -> float | None:
        for at, body in zip(list(self.times), list(self), strict=False):
            if marker in repr(body):
                return at
        return None


def timed_requests(fakes: Fakes, runtime: str) -> TimedList:
    timed = TimedList()
    if runtime == "claude-agent-sdk":
        fakes.anthropic.requests = timed
    else:
        fakes.responses._recorded.requests = timed
    return timed


@dataclass
class Row:
    runtime: str
    mode: str = ""
    ttft_ms: list[float] = field(default_factory=list)
    steered_ms: list[float] = field(default_factory=list)
    model_ms: list[float] = field(default_factory=list)


async def stored(cp: Any, run_id: str, kind: str, timeout: float = 60) -> dict[str, Any]:
    event: dict[str, Any] = await cp.wait_for_event(
        INSTANCE, lambda e: e["run_id"] == run_id and e["kind"] == kind, timeout=timeout
    )
    return event


async def terminal(cp: Any, run_id: str) -> None:
    await cp.wait_for_event(INSTANCE, lambda e: e["run_id"] == run_id and e["kind"] in TERMINALS, timeout=90)


async def measure(runtime: str, runs: int, fakes: Fakes) -> Row:
    row = Row(runtime)
    requests = timed_requests(fakes, runtime)
    with tempfile.TemporaryDirectory(prefix="bench-steer-") as tmp_name:
        tmp = Path(tmp_name)
        async with rig(tmp, fakes) as r:  # stops the driver when it closes
            cp = r.cp
            _driven.start(r, runtime)
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=90)
            for i in range(runs + 1):  # the first of each is a warm-up, not counted
                fresh = f"fresh-{i}"
                t0 = time.monotonic()
                await cp.send_command(INSTANCE, "input.start", run_id=fresh, input={"text": "[[say:hi]]"})
                await stored(cp, fresh, "message.delta")
                ttft = (time.monotonic() - t0) * 1000
                await terminal(cp, fresh)

                steered, marker = f"steered-{i}", f"[[say:steer {runtime} {i}]]"
                await cp.send_command(INSTANCE, "input.start", run_id=steered, input={"text": STEERED_RUN})
                await stored(cp, steered, "message.delta")
                t0 = time.monotonic()
                await cp.send_command(INSTANCE, "input.steer", run_id=steered, input={"text": marker})
                event = await stored(cp, steered, "input.steered")
                took = (time.monotonic() - t0) * 1000
                await terminal(cp, steered)
                seen = requests.arrived(marker)
                if i == 0:
                    row.mode = str(event["payload"]["mode"])
                    continue
                row.ttft_ms.append(ttft)
                row.steered_ms.append(took)
                if seen is not None:
                    row.model_ms.append((seen - t0) * 1000)
    return row


def report(rows: list[Row], runs: int) -> None:
    def p(values: list[float], q: float) -> str:
        return f"{percentile(values, q):.0f}" if values else "-"

    table(
        f"steer evidence, {runs} runs per runtime (ms)",
        [
            "runtime",
            "mode",
            "steer→input.steered p50",
            "p95",
            "steer→model request p50",
            "p95",
            "fresh input.start TTFT p50",
            "p95",
        ],
        [
            [
                r.runtime,
                r.mode,
                p(r.steered_ms, 50),
                p(r.steered_ms, 95),
                p(r.model_ms, 50),
                p(r.model_ms, 95),
                p(r.ttft_ms, 50),
                p(r.ttft_ms, 95),
            ]
            for r in rows
        ],
    )
    print(
        "\nsteer→model request is when the model sees the text: Codex restarts the response under way with it;"
        "\nClaude Code sends it after the response under way (~2 s here); ACP runs it as one more turn after the"
        "\ncurrent one. steer→input.steered is when the provider has it."
    )


async def main(runs: int, only: list[str]) -> None:
    logs.configure("warning")
    rows: list[Row] = []
    with ExitStack() as stack:
        fakes = Fakes(stack)
        for runtime in _driven.RUNTIMES:
            if only and runtime not in only:
                continue
            print(f"measuring {runtime} ...", flush=True)
            rows.append(await measure(runtime, runs, fakes))
    report(rows, runs)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--only", nargs="*", default=[], help="runtimes to measure (default: all)")
    args = parser.parse_args()
    anyio.run(main, args.runs, args.only)
