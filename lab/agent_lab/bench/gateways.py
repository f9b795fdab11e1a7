"""N gateways over PostgreSQL beside one over SQLite, measured in one run (issue 34).

A fleet of synthetic drivers (the driver's real outbox and link, `bench/fleet.py`) floods the gateways;
figures: stored events/s, CPU µs per event (gateways, and the database's own processes), receipt p99 at a
paced rate (3 gateways vs 1), and re-welcome p50/max after one gateway is SIGKILLed. On 2 shared cores
the gateways, PostgreSQL and the fleet itself compete for the same CPU: per-core figures extrapolate.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import tempfile
import time
from pathlib import Path

from agent_lab.bench._common import median, percentile, table
from agent_lab.bench.fleet import FleetLink, Gateways, drained, flood, run_fleet
from agent_lab.controlplane.pg_cluster import Cluster, new_database

LINKS = 60
PER_LINK = 200
PACED_LINKS = 30
PACED_RATE = 20  # events/s per link
PACED_SECONDS = 3.0


def _db_cpu() -> float:
    """CPU seconds of every process of the `postgres` user (the cluster's backends)."""
    try:
        uid = pwd.getpwnam("postgres").pw_uid
    except KeyError:
        uid = os.getuid()
    total = 0.0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


async def _throughput(store: str, count: int, tmp: Path) -> tuple[float, float, float]:
    gw = Gateways(store, count, tmp)
    gw.start()
    try:
        links = [FleetLink(tmp / f"d{i}", gw.url, f"drv-b-{i:03d}") for i in range(LINKS)]
        figures: list[float] = []

        async def body() -> None:
            cpu0, db0, t0 = gw.cpu_seconds(), _db_cpu(), time.perf_counter()
            await flood(links, PER_LINK)
            await drained(links, timeout=300)
            elapsed = time.perf_counter() - t0
            n = LINKS * PER_LINK
            figures.extend([n / elapsed, (gw.cpu_seconds() - cpu0) / n * 1e6, (_db_cpu() - db0) / n * 1e6])

        await run_fleet(links, body)
    finally:
        gw.stop()
    return figures[0], figures[1], figures[2]


async def _receipt_p99(store: str, count: int, tmp: Path) -> float:
    gw = Gateways(store, count, tmp)
    gw.start()
    try:
        links = [FleetLink(tmp / f"p{i}", gw.url, f"drv-p-{i:03d}") for i in range(PACED_LINKS)]
        found: list[float] = []

        async def body() -> None:
            rounds = await asyncio.gather(*(link.paced(PACED_RATE, PACED_SECONDS) for link in links))
            found.extend(ms for r in rounds for ms in r)

        await run_fleet(links, body)
    finally:
        gw.stop()
    return percentile(found, 99)


async def _rewelcome(store: str, tmp: Path) -> tuple[float, float, int]:
    gw = Gateways(store, 3, tmp)
    gw.start()
    try:
        links = [FleetLink(tmp / f"k{i}", gw.url, f"drv-k-{i:03d}") for i in range(150)]
        killed: list[float] = []

        async def body() -> None:
            gw.kill(0)
            killed.append(time.monotonic())
            await asyncio.sleep(8)  # a bench's observation window: the bound is 1 + 2 s of backoff

        await run_fleet(links, body)
    finally:
        gw.stop()
    delays = sorted(x.welcomes[1] - killed[0] for x in links if len(x.welcomes) > 1)
    return median(delays), delays[-1], len(delays)


async def _main() -> None:
    with Cluster() as pg, tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        rows = []
        runs = [("SQLite, 1 gateway", str(tmp / "cp.db"), 1), ("PostgreSQL, 1 gateway", new_database(pg), 1),
                ("PostgreSQL, 3 gateways", new_database(pg), 3)]  # fmt: skip
        for i, (name, store, count) in enumerate(runs):
            rate, gw_us, db_us = await _throughput(store, count, tmp / f"t{i}")
            rows.append([name, f"{rate:,.0f}", f"{gw_us:.0f}", f"{db_us:.0f}" if "Postgre" in name else "(in gateway)"])
        table(
            f"stored events/s, {LINKS} links x {PER_LINK} events (2 shared cores)",
            ["store", "events/s", "gateway CPU µs/event", "database CPU µs/event"],
            rows,
        )
        p1 = await _receipt_p99(new_database(pg), 1, tmp / "r1")
        p3 = await _receipt_p99(new_database(pg), 3, tmp / "r3")
        table(
            f"receipt p99, {PACED_LINKS} links at {PACED_RATE} events/s each",
            ["gateways", "p99 ms"],
            [["1", f"{p1:.1f}"], ["3", f"{p3:.1f}"], ["ratio 3/1 (goal <= 2)", f"{p3 / p1:.2f}"]],
        )
        p50, worst, n = await _rewelcome(new_database(pg), tmp / "k")
        table("re-welcome after a gateway SIGKILL, 150 links", ["links dropped", "p50 s", "max s"],
              [[n, f"{p50:.2f}", f"{worst:.2f}"]])  # fmt: skip


def main() -> None:
    asyncio.run(_main())


if __name__ == "__main__":
    main()
