"""A provider that breaks its wire protocol (issue 11, flood 3), through the REAL driver process and a
real ACP agent process (`agent_lab/testing/agents/stubborn_acp_agent.py`): malformed JSON, invalid UTF-8, a line
nested 2000 deep, responses to ids never sent (of every JSON type), requests of an unknown method, and
a 100 MiB line. The adapter reports bounded `provider.protocol` diagnostics, answers the unknown
requests with a JSON-RPC error, every run ends with exactly one terminal, and the driver survives."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from tests.faults.history import check_run
from tests.faults.test_command_flood import rss_kib
from tests.faults.test_faults import status
from tests.integration.harness import INSTANCE, DriverProcess, boot_payload, control_plane

pytestmark = pytest.mark.faults


@pytest.fixture
def started() -> Iterator[list[DriverProcess]]:
    ds: list[DriverProcess] = []
    yield ds
    for d in ds:
        d.close()


async def run(cp: Any, run_id: str, text: str) -> dict[str, Any]:
    cid, _ = await cp.send_command(INSTANCE, "input.start", run_id=run_id, input={"text": text})
    return await status(cp, cid, timeout=90)


async def test_protocol_garbage_and_a_100_mib_line(tmp_path: Any, started: list[DriverProcess]) -> None:
    async with control_plane(tmp_path) as cp:
        d = DriverProcess(tmp_path, boot_payload(tmp_path, cp.url))
        started.append(d)
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=30)

        assert (await run(cp, "run-garbage", "[[garbage]]"))["status"] == "completed"
        check_run(cp, "run-garbage", terminal="run.completed")
        final = cp.events(INSTANCE, kinds="run.completed", run_id="run-garbage")[0]["payload"]["final_message_text"]
        assert final == "unknown: -32601,-32601,-32601"  # JSON-RPC "method not found", each time
        diags = [e["payload"] for e in cp.events(INSTANCE, kinds="diagnostic.reported")]
        protocol = [p for p in diags if p["code"] == "provider.protocol"]
        # ~40 violations, 5 reported and one saying the rest are only counted.
        assert len(protocol) == 6, protocol
        assert "only counted" in protocol[-1]["message"]
        assert all("\ufffd" not in p["message"] and "garbage line" not in p["message"] for p in protocol)

        # A 100 MiB line: the reader gives up at its 64 MiB limit, the run fails, the provider is replaced.
        rss_before, peak = rss_kib(d.pid), 0

        async def sample() -> None:
            nonlocal peak
            while True:
                peak = max(peak, rss_kib(d.pid))
                await anyio.sleep(0.05)  # a sampling period, not a wait for a condition

        async with anyio.create_task_group() as tg:
            tg.start_soon(sample)
            huge = await run(cp, "run-huge", "[[huge-line]]")
            tg.cancel_scope.cancel()
        growth_mib = (peak - rss_before) / 1024
        print(f"100 MiB provider line: driver RSS grew by {growth_mib:.0f} MiB")
        assert growth_mib < 200, growth_mib  # the 64 MiB line buffer (and its growth), never the whole line
        assert huge["status"] == "failed", huge
        check_run(cp, "run-huge", terminal="run.failed")
        assert (await run(cp, "run-after", "[[say:still here]]"))["status"] == "completed"
        assert d.proc.poll() is None
        assert "Traceback" not in d.stderr()
