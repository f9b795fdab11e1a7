"""N gateway processes over one PostgreSQL database, and a synthetic fleet of links with real outboxes
(the driver's own `Kernel`, `Outbox` and `Link`, no provider), for the fleet test and the `gateways`
bench. One gateway can be SIGKILLed mid-flood; every link records when it was (re)welcomed."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio

from agent_lab.bench._common import TOKEN
from agent_lab.bench.event_path import DriverSide


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Gateways:
    """`controlplane serve` processes sharing one port (SO_REUSEPORT) over one store."""

    def __init__(self, store: str, count: int, folder: Path, *, heartbeat_ms: int = 1000) -> None:
        self.store = store
        self.count = count
        self.port = free_port()
        folder.mkdir(parents=True, exist_ok=True)
        self.token_file = folder / "cp.token"
        self.token_file.write_text(TOKEN + "\n")
        self.heartbeat_ms = heartbeat_ms
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/driver"

    def start(self) -> None:
        for i in range(1, self.count + 1):
            argv = [sys.executable, "-m", "agent_lab.controlplane.cli", "serve", "--store", self.store,
                    "--gateway-id", f"gw-{i}", "--reuse-port", "--port", str(self.port), "--http-port", "-1",
                    "--token-file", str(self.token_file), "--heartbeat-ms", str(self.heartbeat_ms),
                    "--log-level", "warning"]  # fmt: skip
            proc = subprocess.Popen(argv, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)
            assert proc.stderr is not None
            for line in proc.stderr:  # its first line says it listens
                if b"control plane:" in line:
                    break
            else:
                raise RuntimeError(f"gateway {i} exited with {proc.wait()}")
            self.procs.append(proc)

    def kill(self, index: int) -> None:
        self.procs[index].send_signal(signal.SIGKILL)
        self.procs[index].wait()

    def cpu_seconds(self) -> float:
        total = 0.0
        for p in self.procs:
            try:
                fields = Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return total

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


class FleetLink(DriverSide):
    """A synthetic driver: real outbox and link; every welcome's time is recorded."""

    def __init__(self, tmp: Path, url: str, instance: str) -> None:
        super().__init__(tmp, url, instance)
        self.instance = instance
        self.welcomes: list[float] = []
        on_welcome = self.kernel.on_welcome

        async def timed(welcome: Any) -> None:
            self.welcomes.append(time.monotonic())
            await on_welcome(welcome)

        self.kernel.on_welcome = timed  # type: ignore[method-assign]


async def run_fleet(links: list[FleetLink], body: Callable[[], Awaitable[None]]) -> None:
    """Run every link until `body` returns (every link connected first)."""
    done = anyio.Event()
    started = 0
    all_up = anyio.Event()

    async def one(link: FleetLink) -> None:
        async def wait_body(_: DriverSide) -> None:
            nonlocal started
            started += 1
            if started == len(links):
                all_up.set()
            await done.wait()

        await link.run(wait_body)

    async with anyio.create_task_group() as tg:
        for link in links:
            tg.start_soon(one, link)
        with anyio.fail_after(60):
            await all_up.wait()
        await body()
        done.set()


async def flood(links: list[FleetLink], per_link: int, start: int = 0) -> None:
    """Every link emits `per_link` lossless events (a yield every 8, as adapters do)."""

    async def one(link: FleetLink) -> None:
        for i in range(start, start + per_link):
            await link.emit(i)
            if i % 8 == 0:
                await asyncio.sleep(0)

    await asyncio.gather(*(one(link) for link in links))


async def drained(links: list[FleetLink], timeout: float = 60) -> None:
    with anyio.fail_after(timeout):
        for link in links:
            await link.outbox.drained()
