"""Lossless events per second, and emit-to-receipt latency, through the real event path.

Driver side (this process): the real `Kernel.emit` (payload validation, run stamping), `Outbox`
(seq and id stamping, group-committed SQLite journal with fsync) and `Link` (batches, receipts).
Control plane: the reference `ControlPlane` in a child process (validation, SQLite store with
`synchronous=FULL`, receipt after commit).

Baseline, the goals' yardstick: the durable floor (bench/durable_floor.py), a minimal client that
journals each batch in SQLite WAL with one fsync and sends it over `websockets` to a server that stores
it with one fsync and answers its receipt: the driver's durability with none of its logic, same batch
size, same (uncapped) pipelining. Goals: throughput ≥ 0.5 x the floor's; p99 latency at 1,000 ev/s
≤ 1.5 x the floor's, each p99 the median of LATENCY_ROUNDS rounds' p99s (the rounds of the driver and
of the floor interleaved, so the machine's noise falls on both alike; pooled figures are printed too).

Context (not a goal): the ceiling on this machine, a bare `websockets` client sending the same frames
to a bare server that only answers receipts; and, for latency, the driver against the floor's own
server, which tells the driver's share of the gap from the reference CP's (validation, dedup, three
indexes per stored event).
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import msgspec

from agent_lab.bench._common import boot_payload as make_payload
from agent_lab.bench._common import goal, median, percentile, table
from agent_lab.bench._servers import Child
from agent_lab.bench.durable_floor import FloorClient

N_EVENTS = 30_000
REPS = 3
WARMUP_EVENTS = 2_000
BATCH = 256  # the control plane's max_batch_events, which the driver's batches are cut to
LATENCY_RATE = 1_000  # events per second
LATENCY_SECONDS = 3.0
# Latency rounds, the paths interleaved; the goal compares each path's median round p99. A p99 is a
# window's ~1% slowest events, so one burst of other work on this shared machine during a single 3 s
# window (the driver's or the floor's) used to decide the goal alone: single-run ratios went from 0.1x
# to 10x in one afternoon, and pooling rounds still let one burst set the pooled p99 of either side.
LATENCY_ROUNDS = 5
FILLER = "x" * 80  # a payload of ~150 bytes, the size of a typical tool or plan event


def _payload(i: int) -> dict[str, Any]:
    return {"entries": [{"content": f"step {i} {FILLER}", "status": "pending"}]}


class DriverSide:
    """A real Kernel, Outbox and Link connected to a control plane; no provider is started."""

    def __init__(self, tmp: Path, url: str, instance: str, *, fsync: bool = True) -> None:
        from driver.boot import parse_payload
        from driver.kernel.core import Kernel

        boot = parse_payload(json.dumps(make_payload(tmp, url, instance=instance)).encode())
        self.kernel = Kernel(boot, started_at=time.monotonic(), assemble=True)
        self.outbox = self.kernel.outbox
        if not fsync:
            # Diagnostic only: how much of the driver's time is the disk (the driver never runs so).
            self.kernel.journal._db.execute("PRAGMA synchronous=OFF")
        self.emit_started: list[float] = [0.0]
        self.emitted: dict[str, float] = {}
        self.receipted: dict[str, float] = {}
        self._recording = False
        self._wrap()

    def _wrap(self) -> None:
        """Record, per event id, when its `emit` began and when its receipt was applied."""
        admit, on_receipt = self.outbox.admit, self.outbox.on_receipt

        async def timed_admit(kind: str, payload: bytes, delivery: Any, run_id: str | None, *rest: Any) -> str:
            event_id = await admit(kind, payload, delivery, run_id, *rest)  # rest: a command status
            if self._recording:
                self.emitted[event_id] = self.emit_started[0]
            return event_id

        def timed_receipt(receipt: Any) -> Any:
            if self._recording:
                now = time.perf_counter()
                for event_id in receipt.accepted:
                    self.receipted[event_id] = now
            return on_receipt(receipt)

        self.outbox.admit = timed_admit  # type: ignore[method-assign,assignment]
        self.outbox.on_receipt = timed_receipt  # type: ignore[method-assign]

    async def run(self, body: Callable[[DriverSide], Any]) -> Any:
        from driver.net.link import Link, LinkHooks

        k = self.kernel
        link = Link(
            k.boot.control,
            k.boot.driver_instance_id,
            k.outbox,
            LinkHooks(k.hello, k.heartbeat, k.on_welcome, k.on_command, k.on_final_rejections),
        )
        result: Any = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(k.outbox.run)
            tg.start_soon(link.run)
            with anyio.fail_after(20):
                await link.connected.wait()
            result = await body(self)
            tg.cancel_scope.cancel()
        k.journal.close()
        return result

    async def emit(self, i: int) -> None:
        self.emit_started[0] = time.perf_counter()
        await self.kernel.emit("plan.updated", _payload(i))

    async def flood(self, n: int, start: int = 0) -> float:
        """Emit n events as fast as the producer can (yielding every 64, as an adapter reading a
        provider's stdout does); seconds until every one has its receipt."""
        t0 = time.perf_counter()
        for i in range(start, start + n):
            await self.emit(i)
            if i % 64 == 0:
                await anyio.lowlevel.checkpoint()
        with anyio.fail_after(300):
            await self.outbox.drained()
        return time.perf_counter() - t0

    async def paced(self, rate: int, seconds: float) -> list[float]:
        """Emit at `rate` events/s; emit-to-receipt latencies in ms."""
        self._recording = True
        interval = 1.0 / rate
        t0 = time.perf_counter()
        for i in range(int(rate * seconds)):
            delay = t0 + i * interval - time.perf_counter()
            if delay > 0:
                await anyio.sleep(delay)
            await self.emit(i)
        with anyio.fail_after(60):
            await self.outbox.drained()
        self._recording = False
        return [(self.receipted[e] - t) * 1000 for e, t in self.emitted.items() if e in self.receipted]


def _frames(n: int) -> list[bytes]:
    """The frames the ceiling client sends: the same event envelopes, BATCH per frame."""
    from driver.protocol.events import Event, event_id_for, validate_payload
    from driver.protocol.frames import encode_events_frame
    from driver.queue.outbox import utc_now

    enc = msgspec.json.Encoder()
    bodies = [
        enc.encode(
            Event(
                event_id=event_id_for("drv-bare", 1, i),
                seq=i,
                epoch=1,
                kind="plan.updated",
                delivery="lossless",
                session_id="ses-bench",
                run_id=None,
                occurred_at=utc_now(),
                payload=msgspec.Raw(validate_payload("plan.updated", _payload(i))),
            )
        )
        for i in range(1, n + 1)
    ]
    return [encode_events_frame(b + 1, bodies[i : i + BATCH]) for b, i in enumerate(range(0, n, BATCH))]


async def ceiling(port: int, n: int) -> float:
    from websockets.asyncio.client import connect

    frames = _frames(n)
    async with connect(
        f"ws://127.0.0.1:{port}/",
        subprotocols=["agent-driver.v1"],  # type: ignore[list-item]
        max_size=4 * 1024 * 1024,
        compression=None,
        ping_interval=None,
    ) as ws:
        got = 0

        async def reader() -> None:
            nonlocal got
            async for raw in ws:
                got += len(json.loads(raw)["accepted"])
                if got >= n:
                    return

        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            tg.start_soon(reader)
            for f in frames:
                await ws.send(f.decode())
        return time.perf_counter() - t0


async def floor_flood(port: int, journal: Path, n: int) -> float:
    """The durable floor: seconds from the first admitted event to the last receipt."""
    started: list[float] = []

    async def produce(c: FloorClient) -> None:
        started.append(time.perf_counter())
        for i in range(n):
            c.encode(_payload(i))
            if i % 64 == 0:
                await anyio.lowlevel.checkpoint()

    await FloorClient(journal, port).run(produce)
    return time.perf_counter() - started[0]


async def floor_paced(port: int, journal: Path, rate: int, seconds: float) -> list[float]:
    async def produce(c: FloorClient) -> None:
        interval = 1.0 / rate
        t0 = time.perf_counter()
        for i in range(int(rate * seconds)):
            delay = t0 + i * interval - time.perf_counter()
            if delay > 0:
                await anyio.sleep(delay)
            c.encode(_payload(i))

    client = FloorClient(journal, port)
    await client.run(produce)
    return client.latencies_ms()


async def _throughput(side: DriverSide) -> float:
    await side.flood(WARMUP_EVENTS)
    return await side.flood(N_EVENTS, start=WARMUP_EVENTS)


async def _latency(side: DriverSide) -> list[float]:
    return await side.paced(LATENCY_RATE, LATENCY_SECONDS)


async def _main() -> None:
    from driver import logs

    logs.configure("error")
    # Each throughput is measured REPS times, the variants interleaved, and the median kept: this
    # machine is shared, and interleaving spreads any noise over all variants alike.
    times: dict[str, list[float]] = {"cp": [], "alone": [], "nosync": [], "bare": [], "floor": []}
    with tempfile.TemporaryDirectory(prefix="bench-event-path-") as tmp_s:
        tmp = Path(tmp_s)
        with (
            Child("bare") as bare,
            Child("cp", str(tmp / "cp.sqlite3")) as cp,
            Child("floor", str(tmp / "floor.sqlite3")) as floor,
        ):
            bare_url = f"ws://127.0.0.1:{bare.port}/"  # the driver alone: no CP store behind the receipts
            url = f"ws://127.0.0.1:{cp.port}/driver"
            await ceiling(bare.port, WARMUP_EVENTS)
            await floor_flood(floor.port, tmp / "fw.sqlite3", WARMUP_EVENTS)
            for rep in range(REPS):
                times["floor"].append(await floor_flood(floor.port, tmp / f"f{rep}.sqlite3", N_EVENTS))
                times["bare"].append(await ceiling(bare.port, N_EVENTS))
                times["alone"].append(await DriverSide(tmp / f"a{rep}", bare_url, f"drv-a.{rep}").run(_throughput))
                side = DriverSide(tmp / f"n{rep}", bare_url, f"drv-n.{rep}", fsync=False)
                times["nosync"].append(await side.run(_throughput))
                times["cp"].append(await DriverSide(tmp / f"c{rep}", url, f"drv-c.{rep}").run(_throughput))
            lat: list[list[float]] = []  # one list of samples per round
            lat_alone: list[list[float]] = []
            lat_floor: list[list[float]] = []
            lat_fstore: list[list[float]] = []
            floor_url = f"ws://127.0.0.1:{floor.port}/"
            for r in range(LATENCY_ROUNDS):
                lat_alone.append(await DriverSide(tmp / f"la{r}", bare_url, f"drv-la.{r}").run(_latency))
                lat_fstore.append(await DriverSide(tmp / f"ls{r}", floor_url, f"drv-ls.{r}").run(_latency))
                lat.append(await DriverSide(tmp / f"lc{r}", url, f"drv-lc.{r}").run(_latency))
                lat_floor.append(await floor_paced(floor.port, tmp / f"lf{r}.sqlite3", LATENCY_RATE, LATENCY_SECONDS))

    bare_s, driver_s = median(times["bare"]), median(times["cp"])
    alone_s, nosync_s = median(times["alone"]), median(times["nosync"])
    driver_rate = N_EVENTS / driver_s
    floor_rate = N_EVENTS / median(times["floor"])
    ratio = driver_rate / floor_rate

    def row(name: str, seconds: float) -> list[Any]:
        return [name, seconds, N_EVENTS / seconds, N_EVENTS / seconds / floor_rate]

    size = len(_frames(1)[0]) - 40
    table(
        f"event path: {N_EVENTS:,} lossless events of ~{size} bytes, batches of {BATCH} (median of {REPS})",
        ["path", "seconds", "events/s", "vs floor"],
        [
            row("driver: emit → journal (fsync) → link → reference CP store (fsync) → receipt", driver_s),
            row("driver alone: emit → journal (fsync) → link → bare receipt server", alone_s),
            row("  same, journal fsync OFF (diagnostic: the disk's share)", nosync_s),
            row("durable floor: journal (fsync) → websockets → store (fsync) → receipt", median(times["floor"])),
            row("ceiling: bare websockets client → bare receipt server", bare_s),
        ],
    )
    goal(
        "throughput ≥ 0.5 x the durable floor",
        ratio >= 0.5,
        f"{driver_rate:,.0f} vs {floor_rate:,.0f} ev/s: {ratio:.2f} x",
    )
    if not all(all(rounds) for rounds in (lat, lat_alone, lat_floor, lat_fstore)):
        raise RuntimeError("no latency sample: no event was accepted")

    def round_p99(rounds: list[list[float]]) -> float:
        return median([percentile(r, 99) for r in rounds])

    def lrow(name: str, rounds: list[list[float]]) -> list[Any]:
        pooled = [v for r in rounds for v in r]
        return [
            name,
            len(pooled),
            *(percentile(pooled, p) for p in (50, 90, 99)),
            max(pooled),
            round_p99(rounds),
            " ".join(f"{percentile(r, 99):.1f}" for r in rounds),
        ]

    table(
        f"emit → receipt latency (ms) at {LATENCY_RATE:,} events/s, {LATENCY_ROUNDS} interleaved rounds of "
        f"{LATENCY_SECONDS:.0f} s per path (p50 to max: all rounds pooled)",
        ["path", "events", "p50", "p90", "p99", "max", "median round p99", "each round's p99"],
        [
            lrow("driver → reference CP (store fsync)", lat),
            lrow("driver → bare receipt server", lat_alone),
            lrow("driver → the floor's server (diagnostic: the driver's share, same store)", lat_fstore),
            lrow("durable floor (journal fsync → store fsync)", lat_floor),
        ],
    )
    p99, floor_p99 = round_p99(lat), round_p99(lat_floor)
    goal(
        "p99 ≤ 1.5 x the durable floor's",
        p99 <= 1.5 * floor_p99,
        f"median round p99 {p99:.2f} ms through the reference CP vs the floor's {floor_p99:.2f} ms: "
        f"{p99 / floor_p99:.2f} x",
    )


def main() -> None:
    anyio.run(_main)


if __name__ == "__main__":
    main()
