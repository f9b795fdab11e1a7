"""The driver's idle RSS per runtime (issue 35): the driver process alone, its provider started, no run;
and the provider's start as the driver reports it (`driver.started`'s `timings.provider_start_ms`).

For each runtime the real `agent-driver run` process starts against the reference control plane and
the offline fake model endpoints (the evidence rig), reports `driver.started` (its provider is up),
then idles; its RSS is read from /proc after it has settled. The provider's own processes are not
counted: they are the runtime's, whichever driver starts them. Beside it, in the same run: a Python
process that imports what every driver imports before `hello` (websockets, msgspec, anyio, structlog),
and the import cost of the Claude Agent SDK measured alone (what the `claude-agent-sdk` runtime adds).

    python -m agent_lab.bench.idle_rss [--only RUNTIME ...]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

import anyio

from agent_lab.bench import _driven
from agent_lab.bench._common import ROOT, goal, rss_mb, table
from agent_lab.evidence.rig import rig
from agent_lab.testing.fakes import Fakes
from driver import logs

RUNTIMES = ("acp:stubborn", *_driven.RUNTIMES, "acp:claude-agent-acp")
GOAL_MB = 60.0
SETTLE_S = 3.0  # after driver.started: the provider's first answers are in, the heap has settled
BASE_IMPORTS = "import websockets, msgspec, anyio, structlog"


def _python_rss(code: str) -> float:
    probe = f"{code}\nfrom agent_lab.bench._common import rss_mb\nprint(rss_mb())"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


async def measure(runtime: str, fakes: Fakes) -> tuple[float, float]:
    """(idle RSS MB, provider start ms)."""
    with tempfile.TemporaryDirectory(prefix="bench-idle-") as tmp:
        async with rig(Path(tmp), fakes) as r:
            if runtime == "acp:claude-agent-acp":
                box = r.sandbox(_driven.INSTANCE)
                agent = ROOT / "node_modules" / "@agentclientprotocol" / "claude-agent-acp" / "dist" / "index.js"
                command = [str(ROOT / "node_modules" / ".bin" / "node"), str(agent)]
                env = {
                    "ANTHROPIC_BASE_URL": fakes.anthropic.base_url,
                    "ANTHROPIC_API_KEY": "sk-ant-fake-0123456789",
                    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                    "CLAUDE_CONFIG_DIR": str(box.state_dir / "claude"),
                    "IS_SANDBOX": "1",
                }
                driver = r.start("acp", box, policy="supervised", acp_command=command, acp_env=env)
            else:
                driver = _driven.start(r, runtime)
            started = await r.started(_driven.INSTANCE)
            start_ms = float(started["payload"]["timings"]["provider_start_ms"] or "nan")
            await anyio.sleep(SETTLE_S)  # idling is what is measured: nothing to wait for but time
            return rss_mb(driver.pid), start_ms


async def main(only: list[str]) -> None:
    logs.configure("warning")
    base = _python_rss(BASE_IMPORTS)
    sdk = _python_rss(f"{BASE_IMPORTS}\nimport claude_agent_sdk") - base
    measured: list[tuple[str, float, float]] = []
    with ExitStack() as stack:
        fakes = Fakes(stack)
        for runtime in RUNTIMES:
            if only and runtime not in only:
                continue
            print(f"measuring {runtime} ...", flush=True)
            measured.append((runtime, *await measure(runtime, fakes)))
    table(
        "idle RSS of the driver process (provider started, no run; the provider's processes not counted)",
        ["runtime", "driver RSS MB", "provider start ms"],
        [
            *([name, mb, start] for name, mb, start in measured),
            ["baseline: python + " + BASE_IMPORTS.removeprefix("import "), base, "-"],
            ["the Claude Agent SDK's import alone (added to the baseline)", sdk, "-"],
        ],
    )
    for runtime, mb, _ in measured:
        goal(f"idle RSS ≤ {GOAL_MB:.0f} MB ({runtime})", mb <= GOAL_MB, f"{mb:.1f} MB")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--only", nargs="*", default=[], help="runtimes to measure (default: all)")
    anyio.run(main, parser.parse_args().only)
