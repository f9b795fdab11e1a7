"""Claim 2, startup is fast enough: p50/p95/p99 over N runs, cold and warm, of spawn → `hello` received
by the CP, spawn → provider ready (`driver.started` received: the driver admits it once its provider
is up), and `input.start` → first token (first `message.delta` received); beside the minimal dialer
(lab/agent_lab/evidence/dialer.py) measured in the same run.

Cold: a fresh `state_dir` (the provider's first start there) after the provider's files were evicted
from the page cache with posix_fadvise(DONTNEED), which needs no privilege but is advisory: pages of a
file mapped by a running process stay resident. Warm: a new driver process on the same `state_dir`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from agent_lab.evidence import checks
from agent_lab.evidence.report import Case, Claim, judged
from agent_lab.evidence.rig import Rig, project_root

DIALER_GOAL = 1.25  # spawn → hello ≤ 1.25 x the minimal dialer (p50)


def compile_bytecode() -> str:
    """Write the package's bytecode before timing starts, as `pip install` of the wheel does.

    A checkout run with PYTHONDONTWRITEBYTECODE=1 (this workplace sets it) recompiles every module
    edited since its last `.pyc` at each start: ~0.5 ms a module, paid by the driver and not by the
    dialer, whose libraries were compiled when pip installed them. py_compile writes regardless of
    that variable."""
    import compileall

    import driver

    ok = compileall.compile_dir(str(Path(driver.__file__).parent), quiet=1)
    return (
        "compiled before timing (as a wheel install does)" if ok else "compile failed: some modules start from source"
    )


def provider_files(runtime: str) -> list[Path]:
    root = project_root() / "node_modules"
    if runtime == "claude-agent-sdk":
        import claude_agent_sdk

        dirs = [Path(claude_agent_sdk.__file__).parent / "_bundled"]
    elif runtime == "openai-app-server":
        dirs = [root / "@openai" / "codex-linux-x64", root / "@openai" / "codex"]
    else:
        dirs = [root / "@zed-industries" / "codex-acp-linux-x64", root / "@zed-industries" / "codex-acp"]
    return [p for d in dirs if d.exists() for p in d.rglob("*") if p.is_file() and not p.is_symlink()]


def evict(files: list[Path]) -> dict[str, Any]:
    """Ask the kernel to drop the files' clean pages from the page cache."""
    done, size = 0, 0
    for path in files:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            done += 1
            size += os.fstat(fd).st_size
        finally:
            os.close(fd)
    return {"files": done, "mb": round(size / 2**20, 1)}


async def one_start(rig: Rig, runtime: str, instance: str, epoch: int, n: int) -> dict[str, float]:
    box = rig.sandbox(instance)
    d = rig.start(runtime, box, name=f"driver{n}")
    started = await rig.started(instance, epoch=epoch)
    hello = [t for t, e in rig.tap.hellos if e == epoch and t >= d.spawned_at]
    received = [e["received_at"] for e in rig.tap.for_instance(instance) if e["event_id"] == started["event_id"]]
    run_id = f"run-t{n}"
    t0 = time.perf_counter()
    await rig.cp.send_command(instance, "input.start", run_id=run_id, input={"text": "[[say:first token here]]"})
    await rig.event(instance, lambda e: e["run_id"] == run_id and e["kind"] == "message.delta")
    first = (time.perf_counter() - t0) * 1000
    await rig.terminal(instance, run_id)
    await d.stop()
    rig.drivers.remove(d)
    return {
        "hello": (hello[0] - d.spawned_at) * 1000,
        "ready": (received[0] - d.spawned_at) * 1000,
        "first_token": first,
    }


def dial(rig: Rig, n: int) -> float:
    """spawn → hello of the minimal dialer (its own instance, epoch n)."""
    env = {**os.environ, "EVIDENCE_DIALER_TOKEN": rig.token}
    t0 = time.perf_counter()
    before = len(rig.tap.hellos)
    subprocess.run(
        [sys.executable, "-m", "agent_lab.evidence.dialer", rig.cp.url, "drv-ev-dialer", str(n)],
        env=env,
        cwd=project_root(),
        check=True,
        timeout=60,
        stdout=subprocess.DEVNULL,
    )
    return (rig.tap.hellos[before][0] - t0) * 1000


async def collect(rig: Rig, runtime: str, *, runs: int = 30, **_: Any) -> Claim:
    import anyio

    claim = Claim("startup", runtime)
    bytecode = compile_bytecode()
    files = provider_files(runtime)
    series: dict[str, dict[str, list[float]]] = {"cold": {}, "warm": {}}
    evicted: dict[str, Any] = {}
    dialer: list[float] = []
    try:
        for n in range(runs):
            evicted = evict(files)
            cold = await one_start(rig, runtime, f"drv-ev-start-{runtime}-cold{n}", 1, n)
            for k, v in cold.items():
                series["cold"].setdefault(k, []).append(v)
        for n in range(runs):
            warm = await one_start(rig, runtime, f"drv-ev-start-{runtime}-warm", n + 1, runs + n)
            for k, v in warm.items():
                series["warm"].setdefault(k, []).append(v)
            # Interleaved with the warm starts it is compared with, so the machine's noise at the
            # time weighs on both alike.
            dialer.append(await anyio.to_thread.run_sync(dial, rig, n + 1))
    except Exception as exc:
        claim.cases.append(Case("starts", "failed", {}, f"{type(exc).__name__}: {exc}"[:300]))
        return claim
    labels = {"hello": "spawn → hello", "ready": "spawn → provider ready", "first_token": "input.start → first token"}
    for mode, values in series.items():
        for key, label in labels.items():
            measured = checks.summary_ms(values.get(key, []))
            if mode == "cold":
                measured["page_cache_eviction"] = (
                    f"posix_fadvise(DONTNEED) on {evicted.get('files')} provider files "
                    f"({evicted.get('mb')} MB); advisory"
                )
            failures = [] if measured["n"] == runs else [f"{measured['n']} of {runs} starts measured"]
            claim.cases.append(judged(f"{mode}: {label}", measured, failures))
    driver_p50 = checks.percentile(series["warm"]["hello"], 50) or 0.0
    dialer_p50 = checks.percentile(dialer, 50) or 1.0
    ratio = round(driver_p50 / dialer_p50, 2)
    measured = {
        "driver_warm_p50_ms": driver_p50,
        "dialer": checks.summary_ms(dialer),
        "ratio": ratio,
        "goal": f"≤ {DIALER_GOAL} x",
        "bytecode": bytecode,
    }
    failures = [] if ratio <= DIALER_GOAL else [f"spawn → hello is {ratio} x the minimal dialer (goal ≤ {DIALER_GOAL})"]
    claim.cases.append(
        judged(
            "spawn → hello vs a minimal dialer",
            measured,
            failures,
            "lab/agent_lab/evidence/dialer.py: imports websockets client, msgspec, anyio, structlog; dials; one hello; "
            "one dialer start after each warm driver start",
        )
    )
    claim.notes.append(f"{runs} runs per mode; the model is the fake endpoint (no network, no model latency)")
    return claim
