"""RSS growth while lossless events are backlogged with the link down, beside the same flood with the
control plane up (issue 10, "performance goals restated").

Each variant runs in a fresh child process and reports its own RSS before and after its flood:
- down: the real `Kernel.emit` → `Outbox` → journal, with the `Link` dialing a closed port (down,
  reconnecting with backoff), so every event stays pending;
- up: the same flood with the reference control plane up (a child process, SQLite store), measured
  once every event has its receipt: nothing pending;
- down, 1M: a million events pending with AGENT_DRIVER_OUTBOX_MAX_EVENTS=1000000 and
  AGENT_DRIVER_OUTBOX_MAX_BYTES=1 GiB: the byte bound (default 256 MiB, PROTOCOL §4.1) is
  independent of the event bound and would stop this flood at ~809k events of ~330 bytes, so the
  bench raises it too (it bounds the journal on disk; memory does not grow with it);
- baseline: the same encoded events kept in a plain Python list (a naive in-memory outbox).
Goals: RSS(down, 100k) - RSS(up) ≤ 16 MB; RSS(down, 1M) - RSS(up) ≤ 64 MB.
`python -m agent_lab.bench.backlog_rss --quick` skips the million.
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

from agent_lab.bench._common import ROOT, goal, rss_mb, table
from agent_lab.bench._common import boot_payload as make_payload

N_EVENTS = 100_000
MILLION_MAX_BYTES = 1 << 30  # AGENT_DRIVER_OUTBOX_MAX_BYTES for the million: room for ~330 MB of bodies
WARMUP = 100
FILLER = "x" * 80


def _payload(i: int) -> dict[str, Any]:
    return {"entries": [{"content": f"step {i} {FILLER}", "status": "pending"}]}


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _driver_child(n_events: int, cp_port: int | None) -> dict[str, Any]:
    from driver import logs
    from driver.boot import parse_payload
    from driver.kernel.core import Kernel
    from driver.net.link import Link, LinkHooks

    logs.configure("error")
    with tempfile.TemporaryDirectory(prefix="bench-backlog-") as tmp_s:
        tmp = Path(tmp_s)
        url = f"ws://127.0.0.1:{cp_port or _closed_port()}/driver"
        boot = parse_payload(json.dumps(make_payload(tmp, url)).encode())
        k = Kernel(boot, started_at=time.monotonic(), assemble=True)
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
            blocked_at = None
            with anyio.fail_after(900):
                for i in range(WARMUP, n_events):
                    if cp_port is None and k.outbox._full():
                        # Link down and the outbox at its bound (events or bytes): admission would
                        # wait forever. Report where it stopped instead of hanging.
                        blocked_at = i
                        break
                    await k.emit("plan.updated", _payload(i))
                    if i % 256 == 0:
                        await anyio.lowlevel.checkpoint()
            await k.outbox.flush()
            if cp_port is not None:
                with anyio.fail_after(300):
                    await k.outbox.drained()
            seconds = time.perf_counter() - t0
            gc.collect()
            after = rss_mb()
            pending = k.outbox.pending_count
            journal_mb = sum(p.stat().st_size for p in k.journal.path.parent.glob("journal.sqlite3*")) / 2**20
            tg.cancel_scope.cancel()
        k.journal.close()
    return {
        "before": before,
        "after": after,
        "pending": pending,
        "seconds": seconds,
        "journal_mb": journal_mb,
        "blocked_at": blocked_at,
    }


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


def _spawn(variant: str, n_events: int = N_EVENTS, cp_port: int | None = None) -> dict[str, Any]:
    import os

    env = {**os.environ, "AGENT_DRIVER_OUTBOX_MAX_EVENTS": str(max(n_events, N_EVENTS))}
    if n_events > N_EVENTS:
        env["AGENT_DRIVER_OUTBOX_MAX_BYTES"] = str(MILLION_MAX_BYTES)
    out = subprocess.run(
        [sys.executable, "-m", "agent_lab.bench.backlog_rss", "--child", variant, str(n_events), str(cp_port or 0)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
        check=True,
        env=env,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        n, port = int(sys.argv[3]), int(sys.argv[4]) or None
        result = anyio.run(_driver_child, n, port) if sys.argv[2] == "driver" else _naive_child()
        print(json.dumps(result))
        return
    from agent_lab.bench._servers import Child

    quick = "--quick" in sys.argv[1:]
    with tempfile.TemporaryDirectory(prefix="bench-backlog-cp-") as tmp, Child("cp", f"{tmp}/cp.sqlite3") as cp:
        up = _spawn("driver", N_EVENTS, cp.port)
    down, naive = _spawn("driver"), _spawn("naive")
    million = None if quick else _spawn("driver", 1_000_000)

    def row(name: str, r: dict[str, Any]) -> list[Any]:
        return [
            name,
            r["before"],
            r["after"],
            r["after"] - r["before"],
            r["after"] - up["after"],
            r["pending"],
            r["journal_mb"],
            r["seconds"],
        ]

    rows = [
        row(f"driver, CP up: {N_EVENTS:,} events, all receipted", up),
        row(f"driver, link down: {N_EVENTS:,} pending", down),
        *(
            [row("driver, link down: 1,000,000 pending (OUTBOX_MAX_EVENTS=1000000, MAX_BYTES=1 GiB)", million)]
            if million
            else []
        ),
        [
            "baseline: the encoded events in a Python list",
            naive["before"],
            naive["after"],
            naive["after"] - naive["before"],
            "-",
            naive["pending"],
            "-",
            "-",
        ],
    ]
    table(
        "backlog: RSS of the driver process (MB), link down vs the same flood with the CP up",
        ["variant", "before", "after", "growth", "vs CP up", "pending", "journal MB", "admit s"],
        rows,
    )  # fmt: skip
    extra = down["after"] - up["after"]
    goal(
        "100k pending: RSS ≤ CP-up RSS + 16 MB",
        extra <= 16,
        f"{extra:+.1f} MB, {extra * 2**20 / N_EVENTS:+.0f} B/event",
    )
    if million and million["blocked_at"] is not None:
        print(
            f"  note: the 1M flood stopped at {million['pending']:,} pending: the outbox reached a bound "
            f"({MILLION_MAX_BYTES:,} bytes or 1,000,000 events) with the link down"
        )
    if million:
        extra_m = million["after"] - up["after"]
        goal(
            "1M pending: RSS ≤ CP-up RSS + 64 MB",
            extra_m <= 64,
            f"{extra_m:+.1f} MB with {million['pending']:,} pending, "
            f"{extra_m * 2**20 / max(1, million['pending']):+.0f} B/event",
        )


if __name__ == "__main__":
    main()
