"""Terminals and processes beside the agent (PROTOCOL §6.8), through the real driver process and the
reference control plane (in this process; every figure is taken where the CP has stored the event).

1. Keystroke to echo: a `process.input` of one character to a PTY running `cat` until the echoed
   character's `process.output` is stored at the CP; p50/p95 beside a local PTY echo (this process
   writes the master of its own PTY and reads the echo back, no driver, no link).
2. Output throughput: `cat` of a 100 MiB file (pipes) until its `process.exited` is stored; MB/s of
   output stored at the CP, and the driver process's CPU time over that window (cat's own excluded).
3. The lossless path under a flood: commands at a fixed rate (a `host_tool.result` for no call, refused
   at once; each ends in a lossless `command.finished`), the time from sending one to its
   `command.finished` being stored; p99 without and with a process flooding output (`yes`).
   Goal: with ≤ 1.5 x without (the median of rounds, interleaved, so the machine's noise falls on
   both alike).

`BENCH_PROCESSES_MIB` sets the size of the file (default 100).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agent_lab.bench._common import INSTANCE, ROOT, TOKEN, boot_payload, cpu_seconds, goal, median, percentile, table

KEYSTROKES = 200
FILE_MIB = int(os.environ.get("BENCH_PROCESSES_MIB", "100"))
RATE = 50  # commands per second on the lossless path
ROUND_S = 4.0
ROUNDS = 5


def local_pty_echo(n: int) -> list[float]:
    """One character written to the master of a PTY running `cat`, until its echo is read back (ms)."""
    master, slave = os.openpty()
    proc = subprocess.Popen(["cat"], stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    out = []
    try:
        for i in range(n):
            ch = bytes([97 + i % 26])
            t0 = time.perf_counter()
            os.write(master, ch)
            got = b""
            while ch not in got:
                got += os.read(master, 64)
            out.append((time.perf_counter() - t0) * 1000)
    finally:
        proc.kill()
        proc.wait()
        os.close(master)
    return out


class Bench:
    def __init__(self, cp: Any) -> None:
        self.cp = cp
        self.sub = cp.subscribe(INSTANCE)
        self.waiters: list[tuple[Any, asyncio.Future[dict[str, Any]]]] = []
        self.task = asyncio.get_running_loop().create_task(self._pump())

    async def _pump(self) -> None:
        async for item in self.sub:
            if item.get("type") != "event":
                continue
            for entry in list(self.waiters):
                match, fut = entry
                if not fut.done() and match(item):
                    fut.set_result(item)
                    self.waiters.remove(entry)

    def expect(self, match: Any) -> asyncio.Future[dict[str, Any]]:
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.waiters.append((match, fut))
        return fut

    async def command(self, kind: str, **fields: Any) -> dict[str, Any]:
        cid, _ = await self.cp.send_command(INSTANCE, kind, **fields)
        status: dict[str, Any] = await self.cp.wait_for_command_status(cid, timeout=60)
        if status["status"] != "completed":
            raise RuntimeError(f"{kind} failed: {status.get('error')}")
        return status

    async def keystrokes(self, n: int) -> list[float]:
        await self.command("process.start", process_id="echo", argv=["cat"], pty={"cols": 80, "rows": 24})
        out = []
        for i in range(n):
            ch = chr(97 + i % 26)
            fut = self.expect(
                lambda e, ch=ch: (
                    e["kind"] == "process.output"
                    and e["payload"]["process_id"] == "echo"
                    and ch in e["payload"]["data"]
                )
            )
            t0 = time.perf_counter()
            await self.cp.send_command(INSTANCE, "process.input", process_id="echo", data=ch)
            await asyncio.wait_for(fut, 30)
            out.append((time.perf_counter() - t0) * 1000)
        await self.command("process.signal", process_id="echo", signal="KILL")
        return out

    async def throughput(self, path: Path, driver_pid: int) -> tuple[float, float, float, int, int]:
        received = 0

        def count(e: dict[str, Any]) -> bool:
            nonlocal received
            if e["kind"] == "process.output" and e["payload"]["process_id"] == "cat":
                received += len(e["payload"]["data"])
            return bool(e["kind"] == "process.exited" and e["payload"]["process_id"] == "cat")

        exited = self.expect(count)
        cpu0, t0 = cpu_seconds(driver_pid), time.perf_counter()
        await self.cp.send_command(INSTANCE, "process.start", process_id="cat", argv=["cat", str(path)])
        end = await asyncio.wait_for(exited, 600)
        elapsed, cpu = time.perf_counter() - t0, cpu_seconds(driver_pid) - cpu0
        total = int(end["payload"]["output_bytes"])
        return received / elapsed / 1e6, elapsed, cpu / elapsed * 100, received, total

    async def lossless_round(self, seconds: float) -> list[float]:
        sent: dict[str, float] = {}
        done: list[float] = []
        finished = asyncio.Event()
        n = int(seconds * RATE)

        def match(e: dict[str, Any]) -> bool:
            if e["kind"] != "command.finished":
                return False
            t = sent.pop(e["payload"]["command_id"], None)
            if t is not None:
                done.append((time.perf_counter() - t) * 1000)
                if len(done) == n:
                    finished.set()
            return False  # keep listening

        self.waiters.append((match, asyncio.get_running_loop().create_future()))
        start = time.perf_counter()
        for i in range(n):
            delay = start + i / RATE - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            cid = f"cmd-bench-{time.monotonic_ns()}-{i}"
            sent[cid] = time.perf_counter()
            # A host tool result for no call: refused at once, its lossless command.finished is the probe.
            await self.cp.send_command(INSTANCE, "host_tool.result", command_id=cid, call_id="no-such-call", content=[])
        await asyncio.wait_for(finished.wait(), 120)
        self.waiters = [w for w in self.waiters if w[0] is not match]
        return done

    def close(self) -> None:
        self.task.cancel()
        self.sub.close()


async def run() -> None:
    from agent_lab.controlplane.server import ControlPlane
    from driver import logs

    logs.configure("warning")  # the in-process CP's lines would drown the tables

    local = local_pty_echo(KEYSTROKES)
    with tempfile.TemporaryDirectory(prefix="bench-processes-") as tmpdir:
        tmp = Path(tmpdir)
        big = tmp / "big.txt"
        line = b"0123456789abcdefghijklmnopqrstuvwxyz-the quick brown fox jumps over the lazy dog\n"
        with big.open("wb") as f:
            block = line * (1024 * 1024 // len(line) + 1)
            for _ in range(FILE_MIB):
                f.write(block[: 1024 * 1024])
        async with ControlPlane(tmp / "cp.sqlite3", tokens={TOKEN: {INSTANCE}}, heartbeat_interval_ms=1000) as cp:
            boot = tmp / "boot.json"
            import json

            boot.write_text(json.dumps(boot_payload(tmp, cp.url)))
            boot.chmod(0o600)
            env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_DRIVER")}
            env["AGENT_DRIVER_PROJECT_ROOT"] = str(ROOT)
            log = (tmp / "driver.log").open("wb")
            driver = subprocess.Popen(  # noqa: ASYNC220 - one spawn, before anything is measured
                [sys.executable, "-m", "driver.cli", "run", "--boot-file", str(boot)],
                stdout=subprocess.DEVNULL,
                stderr=log,
                env=env,
                cwd=ROOT,
                start_new_session=True,
            )
            bench = Bench(cp)
            try:
                await cp.wait_connected(INSTANCE, timeout=60)
                await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=60)
                remote = await bench.keystrokes(KEYSTROKES)
                mbps, elapsed, cpu_pct, received, total = await bench.throughput(big, driver.pid)
                quiet: list[float] = []
                flooded: list[float] = []
                flood_bytes: list[int] = []
                for r in range(ROUNDS):
                    quiet.append(percentile(await bench.lossless_round(ROUND_S), 99))
                    await bench.command("process.start", process_id=f"flood-{r}", argv=["yes", "flood " * 20])
                    flooded.append(percentile(await bench.lossless_round(ROUND_S), 99))
                    ended = bench.expect(
                        lambda e, r=r: e["kind"] == "process.exited" and e["payload"]["process_id"] == f"flood-{r}"
                    )
                    await bench.command("process.signal", process_id=f"flood-{r}", signal="KILL")
                    flood_bytes.append(int((await asyncio.wait_for(ended, 30))["payload"]["output_bytes"]))
            finally:
                bench.close()
                driver.kill()
                driver.wait()
                log.close()

    table(
        "Keystroke to echo (ms)",
        ["path", "p50", "p95", "n"],
        [
            ["local PTY (no driver)", percentile(local, 50), percentile(local, 95), len(local)],
            [
                "process.input -> process.output stored at the CP",
                percentile(remote, 50),
                percentile(remote, 95),
                len(remote),
            ],
        ],
    )
    table(
        f"cat of a {FILE_MIB} MiB file through the link",
        ["MB/s stored at the CP", "seconds", "driver CPU % of a core", "bytes stored", "bytes produced"],
        [[mbps, elapsed, cpu_pct, received, total]],
    )
    table(
        f"Lossless path p99 (ms), {RATE} commands/s, {ROUNDS} rounds of {ROUND_S:.0f} s",
        ["condition", "median p99", "round p99s"],
        [
            ["quiet", median(quiet), " ".join(f"{v:.1f}" for v in quiet)],
            ["a process flooding output", median(flooded), " ".join(f"{v:.1f}" for v in flooded)],
        ],
    )
    rates = ", ".join(f"{b / ROUND_S / 1e6:.1f}" for b in flood_bytes)
    print(f"  the flood's output meanwhile: {rates} MB/s per round (it is slowed while lossless work waits)")
    ratio = median(flooded) / median(quiet)
    goal("processes.lossless_p99_under_flood", ratio <= 1.5, f"{ratio:.2f}x the quiet p99 (goal <= 1.5x)")


def main() -> None:
    asyncio.run(run())


if __name__ == "__main__":
    main()
