"""Cold start (process spawn to `hello` received by the control plane), idle RSS and idle CPU.

The control plane runs in this process and notes the moment it decodes each `hello`. The driver is
the real `agent-driver run` process with the stubborn ACP agent as provider (started once the first
`hello` is out, as always). Baseline, in the same run: the minimal dialer (lab/agent_lab/evidence/dialer.py), a
Python process that imports the same `websockets` client, `msgspec`, `anyio` and `structlog` (the
card's logger, issue 26), dials the same
control plane and sends one `hello`: spawn → that `hello` decoded, timed exactly like the driver's.
Also the RSS of a Python process that imported the same three libraries.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

from agent_lab.bench._common import INSTANCE, ROOT, TOKEN, cpu_seconds, driver_env, goal, median, rss_mb, table
from agent_lab.bench._common import boot_payload as make_payload
from agent_lab.evidence.startup import compile_bytecode

RUNS = 11
IDLE_SECONDS = 4.0
BASELINE_IMPORTS = "import websockets, msgspec, anyio"
DIALER_INSTANCE = "drv-bench-dialer"
GOAL_RATIO = 1.25


def _dial(url: str, epoch: int) -> float:
    """Spawn the minimal dialer; return its spawn time (its hello is timed by the CP's decode)."""
    env = {**driver_env(), "EVIDENCE_DIALER_TOKEN": TOKEN}
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "agent_lab.evidence.dialer", url, DIALER_INSTANCE, str(epoch)],
        cwd=ROOT,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return t0


def _baseline_rss() -> float:
    code = f"{BASELINE_IMPORTS}\nfrom agent_lab.bench._common import rss_mb\nprint(rss_mb())"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def _spawn(tmp: Path, url: str, n: int) -> subprocess.Popen[bytes]:
    boot = tmp / f"boot-{n}.json"
    boot.write_text(json.dumps(make_payload(tmp, url)))
    boot.chmod(0o600)
    return subprocess.Popen(
        [sys.executable, "-m", "driver.cli", "run", "--boot-file", str(boot), "--log-level", "warning"],
        cwd=ROOT,
        env=driver_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _started_at_epoch(epoch: int) -> Callable[[dict[str, Any]], bool]:
    return lambda e: e["kind"] == "driver.started" and e["epoch"] == epoch


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


async def _main() -> None:
    from agent_lab.controlplane.server import ControlPlane
    from driver import logs
    from driver.protocol.frames import Hello

    logs.configure("error")
    print("bytecode:", compile_bytecode())
    base_ms: list[float] = []
    base_rss = _baseline_rss()
    hello_ms: list[float] = []
    boot_ms: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-cold-") as tmp_s:
        tmp = Path(tmp_s)
        async with ControlPlane(tmp / "cp.sqlite3", tokens={TOKEN: {INSTANCE, DIALER_INSTANCE}}, http_port=None) as cp:
            seen: list[float] = []
            decode = cp._decode

            def timed_decode(raw: str | bytes) -> Any:
                frame = decode(raw)
                if isinstance(frame, Hello):
                    seen.append(time.perf_counter())
                return frame

            cp._decode = timed_decode  # type: ignore[method-assign]
            proc: subprocess.Popen[bytes] | None = None
            # Interleaved, one dialer start then one driver start per round: a noisy machine slows
            # both alike instead of whichever block of runs it happened to fall on.
            for n in range(1, RUNS + 1):
                seen.clear()
                spawned = await anyio.to_thread.run_sync(_dial, cp.url, n)
                base_ms.append((seen[0] - spawned) * 1000)
                seen.clear()
                t0 = time.perf_counter()
                proc = _spawn(tmp, cp.url, n)
                try:
                    await cp.wait_until(lambda: bool(seen) and cp.connected(INSTANCE), timeout=30)
                    hello_ms.append((seen[0] - t0) * 1000)
                    started = await cp.wait_for_event(INSTANCE, _started_at_epoch(n), timeout=30)
                    boot_ms.append(float(started["payload"]["timings"]["boot_ms"]))
                finally:
                    if n < RUNS:
                        _kill(proc)
                        await cp.wait_disconnected(INSTANCE, timeout=30)
            assert proc is not None
            try:
                # Idle: the last driver, its provider started, no run; heartbeats every 5 s.
                await anyio.sleep(1.0)
                idle_rss = rss_mb(proc.pid)
                c0, t0 = cpu_seconds(proc.pid), time.perf_counter()
                await anyio.sleep(IDLE_SECONDS)
                idle_cpu = (cpu_seconds(proc.pid) - c0) / (time.perf_counter() - t0) * 100
            finally:
                _kill(proc)

    ratio = median(hello_ms) / median(base_ms)

    def row(name: str, values: list[float]) -> list[Any]:
        return [name, median(values), f"{min(values):.0f}-{max(values):.0f}"]

    table(
        f"cold start ({RUNS} runs each, median; min-max)",
        ["what", "ms", "range"],
        [
            row("driver: spawn → hello received by the CP", hello_ms),
            row("driver: its own boot_ms (start → provider started)", boot_ms),
            row("baseline: minimal dialer, spawn → hello received by the CP", base_ms),
        ],
    )
    goal(f"spawn → hello ≤ {GOAL_RATIO} x the minimal dialer", ratio <= GOAL_RATIO, f"{ratio:.2f} x")
    table(
        "idle daemon (driver process only, provider running as its child, no run)",
        ["what", "value"],
        [
            ["driver RSS MB", idle_rss],
            ["baseline RSS MB (python + websockets, msgspec, anyio)", base_rss],
            [f"driver CPU % over {IDLE_SECONDS:.0f} s idle", idle_cpu],
        ],
    )
    goal("idle RSS ≤ 60 MB", idle_rss <= 60, f"{idle_rss:.1f} MB")


def main() -> None:
    anyio.run(_main)


if __name__ == "__main__":
    main()
