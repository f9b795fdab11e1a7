"""Shared pieces of the benchmarks: tables, goals, /proc readings, percentiles, a boot payload."""

from __future__ import annotations

import json
import os
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent_lab.testing.agents import STUBBORN as STUBBORN


def _project_root() -> Path:
    """Where node_modules with the pinned runtimes is: driver.kernel.options.project_root's rule
    (AGENT_DRIVER_PROJECT_ROOT, else beside the `driver` package), without importing the kernel: the
    RSS baselines import this module."""
    env = os.environ.get("AGENT_DRIVER_PROJECT_ROOT")
    if env:
        return Path(env)
    import driver

    return Path(driver.__file__).resolve().parent.parent


ROOT = _project_root()
TOKEN = "bench-token-0000"
INSTANCE = "drv-bench.1"


def table(title: str, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Print an aligned text table."""
    cells = [[str(c) for c in header]] + [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    print(f"\n{title}")
    line = "  ".join("-" * w for w in widths)
    print(line)
    for n, r in enumerate(cells):
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))))
        if n == 0:
            print(line)
    print(line)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.2f}" if abs(value) < 100 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


GOALS_PREFIX = "BENCH-GOAL "  # a machine-readable copy of each goal line, for `agent-driver evidence`


def goal(name: str, met: bool, detail: str) -> bool:
    print(f"  goal {name}: {'met' if met else 'NOT met'} ({detail})")
    print(GOALS_PREFIX + json.dumps({"goal": name, "met": met, "measured": detail}), flush=True)
    return met


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))
    return ordered[k]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def rss_mb(pid: int | str = "self") -> float:
    """Resident set size of one process (not its children), from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def cpu_seconds(pid: int | str = "self") -> float:
    """User plus system CPU time of one process, from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return ticks / os.sysconf("SC_CLK_TCK")


def boot_payload(
    tmp: Path, url: str, *, runtime: str = "acp", instance: str = INSTANCE, **execution: Any
) -> dict[str, Any]:
    """A boot payload; by default our stubborn ACP agent (a real process, no model) as provider."""
    (tmp / "cwd").mkdir(parents=True, exist_ok=True)
    ex: dict[str, Any] = {
        "revision": "rev-bench",
        "runtime": runtime,
        "permission_policy": "full_access",
        "environment": {},
    }
    if runtime == "acp":
        ex["acp"] = {"command": [sys.executable, str(STUBBORN), "normal"]}
    ex.update(execution)
    return {
        "protocol": 1,
        "driver_instance_id": instance,
        "control": {"url": url, "token": TOKEN},
        "session": {
            "id": "ses-bench",
            "agent_id": "agt-bench",
            "kind": "pet",
            "cwd": str(tmp / "cwd"),
            "state_dir": str(tmp / "state"),
            "idle_exit_ms": None,
        },
        "execution": ex,
    }


def driver_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_DRIVER")}
    env["AGENT_DRIVER_PROJECT_ROOT"] = str(ROOT)
    return env
