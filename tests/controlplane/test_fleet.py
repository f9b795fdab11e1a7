"""The fleet (issue 34): 3 gateway processes over one PostgreSQL database on one shared port, 150
synthetic drivers with the driver's real outbox and link, and real drivers (the real `agent-driver run`
process with a real runtime: two with our stubborn ACP agent, one with the Claude Agent SDK's CLI against
the fake Anthropic endpoint), each in the middle of a streaming run when one gateway is SIGKILLed
mid-flood (the gateway holding the first real driver's link). Every event is stored exactly once (none
lost: every outbox drains and every run's final text is whole; none twice: no (instance, seq) twice),
every run ends exactly once, and every link the kill dropped is welcomed again within the backoff bound."""

from __future__ import annotations

import time
from contextlib import ExitStack
from pathlib import Path

import anyio
import asyncpg
from agent_lab.bench.fleet import FleetLink, Gateways, drained, flood, run_fleet
from agent_lab.testing.fakes import Fakes

from tests.controlplane.fleet_drivers import (
    RUN_TERMINALS,
    RealDriver,
    final_text,
    owners,
    start_runs,
    wait_rows,
    watch_reclaims,
)

LINKS = 150
PER_LINK = 30  # events per link before the kill, and as many after
REAL = ("acp:stubborn", "acp:stubborn", "claude-agent-sdk")
WORDS = 160  # the real runs stream this many words, 50 ms apart (8 s): in flight across the kill
# The driver's first redial waits 0-1 s, a second (after a 1013 or a refused dial) 0-2 s (PROTOCOL §2.4);
# the rest is the handshake on a loaded 2-core machine.
REWELCOME_BOUND_S = 1 + 2 + 2


async def test_a_fleet_over_three_gateways_survives_a_gateway_kill(pg_url: str, tmp_path: Path) -> None:
    gateways = Gateways(pg_url, 3, tmp_path, heartbeat_ms=1000)
    gateways.start()
    stack = ExitStack()
    db = await asyncpg.connect(pg_url)
    real: list[RealDriver] = []
    try:
        fakes = Fakes(stack)
        real = [RealDriver(tmp_path / "real", gateways.url, f"drv-real-{i}", r, fakes) for i, r in enumerate(REAL)]
        names = [d.instance for d in real]
        links = [FleetLink(tmp_path / f"d{i}", gateways.url, f"drv-fleet-{i:03d}") for i in range(LINKS)]
        killed_at: list[float] = []
        held: dict[str, tuple[str, int]] = {}
        reclaimed: dict[str, float] = {}

        async def body() -> None:
            await wait_rows(db, "SELECT 1 FROM events WHERE kind = 'driver.started' AND instance_id = ANY($1)",
                            names, count=len(real), timeout=60)  # fmt: skip
            await start_runs(pg_url, real, f"[[slow:{WORDS}]]")
            await wait_rows(db, "SELECT 1 FROM events WHERE kind = 'run.started' AND instance_id = ANY($1)",
                            names, count=len(real), timeout=60)  # fmt: skip
            await flood(links, PER_LINK)
            held.update(await owners(db, names))
            victim = held[real[0].instance][0]
            ended = await db.fetchval(
                "SELECT count(*) FROM events WHERE kind = ANY($1) AND instance_id = ANY($2)", RUN_TERMINALS, names
            )
            assert ended == 0, "a real run ended before the kill: it proves nothing about runs across a kill"
            gateways.kill(int(victim.removeprefix("gw-")) - 1)  # mid-flood: batches of the second half are coming
            killed_at.append(time.monotonic())
            dropped = {i: h for i, h in held.items() if h[0] == victim}
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch_reclaims, db, dropped, reclaimed, 30.0)
                await flood(links, PER_LINK, start=PER_LINK)
                await drained(links, timeout=90)
            await wait_rows(db, "SELECT 1 FROM events WHERE kind = ANY($1) AND instance_id = ANY($2)",
                            RUN_TERMINALS, names, count=len(real), timeout=60)  # fmt: skip

        await run_fleet(links, body)

        terminals = await db.fetch(
            "SELECT instance_id, run_id, kind, payload FROM events WHERE kind = ANY($1) AND instance_id = ANY($2)",
            RUN_TERMINALS,
            names,
        )
        counts = dict(
            await db.fetch(
                "SELECT instance_id, count(*) FROM events WHERE kind = 'plan.updated' "
                "AND instance_id LIKE 'drv-fleet-%' GROUP BY instance_id"
            )
        )
        duplicates = await db.fetchval(
            "SELECT count(*) FROM (SELECT 1 FROM events GROUP BY instance_id, seq HAVING count(*) > 1) d"
        )
        real_seqs = await db.fetch(
            "SELECT instance_id, array_agg(seq ORDER BY seq) FROM events WHERE instance_id = ANY($1) GROUP BY 1", names
        )
    finally:
        for d in real:
            d.close()
        gateways.stop()
        stack.close()
        await db.close()
    # The kill dropped the first real driver's link (and its gateway's share of the fleet); every dropped
    # link, synthetic or real, was welcomed again within the bound.
    dropped_links = [link for link in links if len(link.welcomes) > 1]
    assert dropped_links, "the killed gateway held no synthetic link (SO_REUSEPORT spread none to it)"
    delays = sorted(link.welcomes[1] - killed_at[0] for link in dropped_links)
    assert delays[-1] < REWELCOME_BOUND_S, delays
    dropped_real = {i for i, h in held.items() if h[0] == held[real[0].instance][0]}
    assert real[0].instance in dropped_real and set(reclaimed) == dropped_real
    assert max(reclaimed[i] - killed_at[0] for i in dropped_real) < REWELCOME_BOUND_S, reclaimed
    # Every run ended exactly once, with its whole streamed text (no chunk lost across the kill).
    assert sorted((t["instance_id"], t["run_id"], t["kind"]) for t in terminals) == sorted(
        (d.instance, d.run_id, "run.completed") for d in real
    )
    for t in terminals:
        assert final_text(t).split() == [f"word{i}" for i in range(WORDS)], t["instance_id"]
    # No event twice: not the fleet's (each link's count is what it emitted), not the real drivers'.
    assert counts == {link.instance: 2 * PER_LINK for link in links}
    assert duplicates == 0
    for _, seqs in real_seqs:
        assert len(seqs) == len(set(seqs))
