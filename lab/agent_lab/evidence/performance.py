"""The performance goals restated (issue 10), measured by the benchmarks in agent_lab.bench in the same run
and copied into the report: cold start vs the minimal dialer, throughput and p99 latency vs the
durable floor, backlog RSS beside the same flood with the CP up. Each bench prints one
`BENCH-GOAL {json}` line per goal; a bench that crashed is reported as such."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from agent_lab.evidence.rig import project_root

BENCHES: tuple[tuple[str, list[str]], ...] = (("cold_start", []), ("event_path", []), ("backlog_rss", []))
PREFIX = "BENCH-GOAL "


def parse(output: str, bench: str) -> list[dict[str, Any]]:
    """The goal lines of one bench's output."""
    goals = []
    for line in output.splitlines():
        if line.startswith(PREFIX):
            goals.append({"bench": bench, **json.loads(line[len(PREFIX) :])})
    return goals


def collect() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for bench, args in BENCHES:
        proc = subprocess.run(
            [sys.executable, "-m", f"agent_lab.bench.{bench}", *args],
            cwd=project_root(),
            capture_output=True,
            text=True,
            timeout=1800,
        )
        goals = parse(proc.stdout, bench)
        if proc.returncode != 0 or not goals:
            goals.append({"bench": bench, "goal": "ran", "met": False, "measured": proc.stderr[-300:]})
        out += goals
    return out
