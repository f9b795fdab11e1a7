"""`python -m agent_lab.bench [NAME ...]`: run every benchmark, or the named ones, each in a fresh process.

Names: event_path, backlog_rss, cold_start, ttft, cancel_evidence, acp_agents, heartbeat, containment,
steer, model_proxy, processes, idle_rss, gateways.
Exit status is nonzero only if a benchmark crashed; goals that are not met are printed as such.
"""

from __future__ import annotations

import subprocess
import sys
import time

from agent_lab.bench._common import ROOT

BENCHMARKS = (
    "event_path",
    "backlog_rss",
    "cold_start",
    "ttft",
    "cancel_evidence",
    "acp_agents",
    "heartbeat",
    "containment",
    "steer",
    "model_proxy",
    "processes",
    "idle_rss",
    "gateways",
)


def main(argv: list[str]) -> int:
    if {"-h", "--help"} & set(argv):
        print((__doc__ or "").replace("python -m agent_lab.bench", "agent-driver bench", 1).strip())
        return 0
    names = argv or list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}", file=sys.stderr)
        return 2
    crashed: list[str] = []
    for name in names:
        print(f"\n=== {name} ===", flush=True)
        t0 = time.monotonic()
        # A fresh process per benchmark: RSS and start-up figures must not carry another one's state.
        code = subprocess.call([sys.executable, "-m", f"agent_lab.bench.{name}"], cwd=ROOT)
        print(f"({name}: {time.monotonic() - t0:.0f} s{'' if code == 0 else f', CRASHED with status {code}'})")
        if code != 0:
            crashed.append(name)
    if crashed:
        print(f"\ncrashed: {', '.join(crashed)}", file=sys.stderr)
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
