"""RSS growth while 100,000 lossless events are backlogged with the link down.

Each variant runs in a fresh child process and reports its own RSS before and after the backlog:
- driver: the real `Kernel.emit` → `Outbox` → journal, with the `Link` dialing a closed port (down,
  reconnecting with backoff), so every event stays pending;
- baseline: the same encoded events kept in a plain Python list (a naive in-memory outbox).
"""

from __future__ import annotations

import gc
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel

from bench._common import ROOT, goal, rss_mb, table
from bench._common import boot_payload as make_payload

N_EVENTS = 100_000
WARMUP = 100
FILLER = "x" * 80


def _payload(i: int) -> dict[str, Any]:
    return {"entries": [{"content": f"step {i} {FILLER}", "status": "pending"}]}


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _driver_child() -> dict[str, Any]:
    from driver import logs
    from driver.boot import parse_payload
    from driver.kernel import Kernel
    from driver.link import Link, LinkHooks

    logs.configure("error")
    with tempfile.TemporaryDirectory(prefix="bench-backlog-") as tmp_s:
        tmp = Path(tmp_s)
        url = f"ws://127.0.0.1:{_closed_port()}/driver"
        boot = parse_payload(json.dumps(make_payload(tmp, url)).encode())
        k = Kernel(boot, started_at=time.monotonic())
        link = Link(
            boot.control,
            boot.driver_instance_id,
            k.outbox,
            LinkHooks(k.hello, k.heartbeat, k.on_welcome, k.on_command, k.on_final_rejections),
        )
        async with anyio.create_task_group() as tg:
            tg.start_soon(k.outbox.run)
            tg.start_soon(link.run)
            # Warm up the code paths (imports, SQLite caches) before the baseline reading. The warm-up
            # events count in the backlog: 100,000 is also the outbox's default bound, where it blocks.
            for i in range(WARMUP):
                await k.emit("plan.updated", _payload(i))
            await k.outbox.flush()
            gc.collect()
            before = rss_mb()
            t0 = time.perf_counter()
            with anyio.fail_after(120):
                for i in range(WARMUP, N_EVENTS):
                    await k.emit("plan.updated", _payload(i))
                    if i % 256 == 0:
                        await anyio.lowlevel.checkpoint()
            await k.outbox.flush()
            seconds = time.perf_counter() - t0
            gc.collect()
            after = rss_mb()
            pending = k.outbox.pending_count
            journal_mb = sum(p.stat().st_size for p in k.journal.path.parent.glob("journal.sqlite3*")) / 2**20
            tg.cancel_scope.cancel()
        k.journal.close()
    return {"before": before, "after": after, "pending": pending, "seconds": seconds, "journal_mb": journal_mb}


def _naive_child() -> dict[str, Any]:
    import msgspec

    enc = msgspec.json.Encoder()
    warm = [enc.encode({"kind": "plan.updated", "payload": _payload(i)}) for i in range(1000)]
    del warm
    gc.collect()
    before = rss_mb()
    backlog = [
        enc.encode({"event_id": f"drv/1/{i:06d}", "seq": i, "kind": "plan.updated", "payload": _payload(i)})
        for i in range(N_EVENTS)
    ]
    gc.collect()
    after = rss_mb()
    return {"before": before, "after": after, "pending": len(backlog), "seconds": 0.0, "journal_mb": 0.0}


def _spawn(variant: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "bench.backlog_rss", "--child", variant],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        result = anyio.run(_driver_child) if sys.argv[2] == "driver" else _naive_child()
        print(json.dumps(result))
        return
    drv, naive = _spawn("driver"), _spawn("naive")
    growth = drv["after"] - drv["before"]
    table(
        f"backlog: {N_EVENTS:,} lossless events pending, link down",
        ["variant", "RSS before MB", "RSS after MB", "growth MB", "pending", "journal MB", "admit s"],
        [
            ["driver outbox (journal on disk, bodies beyond 8 MB evicted)", drv["before"], drv["after"], growth,
             drv["pending"], drv["journal_mb"], drv["seconds"]],
            ["baseline: the encoded events in a Python list", naive["before"], naive["after"],
             naive["after"] - naive["before"], naive["pending"], "-", "-"],
        ],
    )  # fmt: skip
    goal("RSS growth ≤ 64 MB", growth <= 64, f"{growth:.1f} MB")


if __name__ == "__main__":
    main()
