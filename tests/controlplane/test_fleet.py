"""The fleet (issue 34): 3 gateway processes over one PostgreSQL database on one shared port, 150
synthetic drivers with the driver's real outbox and link; one gateway SIGKILLed mid-flood. Every event
is stored exactly once (none lost: every outbox drains; none twice: the count equals what was emitted),
and every link the kill dropped is welcomed again within the backoff bound."""

from __future__ import annotations

import time
from pathlib import Path

import asyncpg
from agent_lab.bench.fleet import FleetLink, Gateways, drained, flood, run_fleet

LINKS = 150
PER_LINK = 30  # events per link before the kill, and as many after
# The driver's first redial waits 0-1 s, a second (after a 1013 or a refused dial) 0-2 s (PROTOCOL §2.4);
# the rest is the handshake on a loaded 2-core machine.
REWELCOME_BOUND_S = 1 + 2 + 2


async def test_a_fleet_over_three_gateways_survives_a_gateway_kill(pg_url: str, tmp_path: Path) -> None:
    gateways = Gateways(pg_url, 3, tmp_path, heartbeat_ms=1000)
    gateways.start()
    try:
        links = [FleetLink(tmp_path / f"d{i}", gateways.url, f"drv-fleet-{i:03d}") for i in range(LINKS)]
        killed_at: list[float] = []

        async def body() -> None:
            await flood(links, PER_LINK)
            gateways.kill(0)  # mid-flood: batches of the second half are on their way
            killed_at.append(time.monotonic())
            await flood(links, PER_LINK, start=PER_LINK)
            await drained(links, timeout=90)

        await run_fleet(links, body)
    finally:
        gateways.stop()
    dropped = [link for link in links if len(link.welcomes) > 1]
    assert dropped, "the killed gateway held no link (SO_REUSEPORT spread none to it)"
    delays = sorted(link.welcomes[1] - killed_at[0] for link in dropped)
    assert delays[-1] < REWELCOME_BOUND_S, delays
    db = await asyncpg.connect(pg_url)
    try:
        counts = dict(
            await db.fetch("SELECT instance_id, count(*) FROM events WHERE kind = 'plan.updated' GROUP BY instance_id")
        )
        duplicates = await db.fetchval(
            "SELECT count(*) FROM (SELECT 1 FROM events GROUP BY instance_id, seq HAVING count(*) > 1) d"
        )
    finally:
        await db.close()
    assert counts == {link.instance: 2 * PER_LINK for link in links}
    assert duplicates == 0
