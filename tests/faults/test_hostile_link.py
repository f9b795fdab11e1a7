"""Control planes that misbehave at the transport (issue 11, floods): one that accepts TCP and never
completes the handshake, one that sends a 100 MiB frame, one that sends a frame before `welcome`, one
that never answers pings. Through the real driver process and a misbehaving proxy in front of the
reference control plane: the driver times out, reconnects with backoff, and a run that spans all of
them completes with every lossless event stored once."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.faults.conftest import Drivers
from tests.faults.history import check_run
from tests.faults.link_proxy import HUGE, LinkProxy
from tests.faults.test_faults import booted, drained_heartbeat, start_run, status, wait_step
from tests.integration.harness import INSTANCE, control_plane

pytestmark = pytest.mark.faults


def log_lines(stderr: str) -> list[dict[str, Any]]:
    out = []
    for line in stderr.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


async def test_hostile_links_time_out_and_reconnect_losing_nothing(tmp_path: Any, drivers: Drivers) -> None:
    async with control_plane(tmp_path) as cp:
        parts = urlsplit(cp.url)
        assert parts.port is not None
        modes = ["pass", "hang", "huge", "prewelcome", "mute"]
        async with LinkProxy(parts.port, modes) as proxy:
            d = drivers.start(f"ws://127.0.0.1:{proxy.port}{parts.path}")
            await booted(cp)
            cid = await start_run(cp, "run-1", "[[flood:300:20]]")
            await wait_step(cp, "run-1", 5)
            assert await cp.close_link(INSTANCE, 1006)  # end the first, good link: the bad ones follow
            # hang: the 10 s open timeout; then backoff delays of up to 2, 4, 8 and 16 s.
            await proxy.wait_connections(len(modes) + 1, timeout=120)
            assert (await status(cp, cid, timeout=120))["status"] == "completed"
            hb = await drained_heartbeat(cp)
            check_run(
                cp,
                "run-1",
                terminal="run.completed",
                flood_steps=300,
                heartbeat_dropped=hb["outbox"]["best_effort_dropped"],
            )
            assert hb["outbox"]["lossless_pending"] == 0
            assert d.proc.poll() is None
            huge = next(c for c in proxy.connections if c.mode == "huge")
            await huge.done.wait()
            # websockets refuses the frame from its header (1009) and discards what follows while it
            # waits for the closing handshake: the 100 MiB pass through, they are never buffered.
            assert huge.huge_bytes_sent <= HUGE
            logs = log_lines(d.stderr())
            closed = [e.get("sent") for e in logs if e.get("event") == "link.closed"]
            assert 1009 in closed  # the 100 MiB frame: "message too big"
            assert 4400 in closed  # a frame before welcome
            assert 4408 in closed  # silence: no pong, no frame for 3 heartbeat intervals
            failed = [e.get("error", "") for e in logs if e.get("event") == "link.dial_failed"]
            assert any(error.startswith("TimeoutError") for error in failed)
            assert [c.mode for c in proxy.connections][: len(modes) + 1] == [*modes, "pass"]
