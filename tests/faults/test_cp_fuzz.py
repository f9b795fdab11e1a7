"""Property-based frames from the control plane into the REAL driver process (issue 11, fuzz 1).

Hypothesis draws frames of every type with random, missing, wrongly typed, oversized, deeply nested
and unknown fields, unknown types, non-JSON text and binary frames (`cp_frames.py`); the reference
control plane sends them raw while a run streams. The driver must not crash, must answer every frame
that decodes as a command (PROTOCOL §3: `accepted`, then `command.invalid`/`command.conflict`/...),
ignore the rest, and the run must complete with every lossless event stored once. Then the frames
that end a link (invalid UTF-8, a second `welcome`, over 4 MiB) are sent one at a time: each closes
the link (1007, 4400, 1009) and the driver reconnects.

The default draws 150 frames (derandomized, so CI is reproducible); `-m long` draws 3000 at random.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from agent_lab.controlplane.server import ControlPlane
from hypothesis import HealthCheck, Phase, given, settings

from driver.protocol.frames import CommandFrame, FrameError, decode_inbound
from tests.faults.conftest import Drivers
from tests.faults.cp_frames import Frame, cp_frames, oversized_command
from tests.faults.history import check_run
from tests.faults.test_faults import booted, next_heartbeat, start_run, status, wait_step
from tests.integration.harness import INSTANCE, control_plane

pytestmark = pytest.mark.faults
MAX_FRAME = 4 * 1024 * 1024


def draw_frames(n: int, *, derandomize: bool) -> list[Frame]:
    frames: list[Frame] = []

    @settings(
        max_examples=n,
        database=None,
        deadline=None,
        derandomize=derandomize,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(cp_frames)
    def collect(frame: Frame) -> None:
        frames.append(frame)

    collect()
    return frames


def command_id_of(frame: Frame) -> str | None:
    """The command id the driver must answer: the frame decodes as a command (the driver's own reading
    of PROTOCOL §3's frame shape; everything else is logged and ignored)."""
    data, text = frame
    if not text:
        return None
    try:
        decoded = decode_inbound(data)
    except (FrameError, UnicodeDecodeError, RecursionError):
        return None
    return decoded.command_id if isinstance(decoded, CommandFrame) else None


async def send(cp: ControlPlane, frame: Frame) -> None:
    for _ in range(3):
        try:
            await cp.send_raw(INSTANCE, frame[0], text=frame[1])
            return
        except RuntimeError:  # between links: wait for the next one
            await cp.wait_connected(INSTANCE, timeout=30)
    raise AssertionError("the driver did not come back")


async def ending_the_link(cp: ControlPlane, frame: Frame) -> None:
    closed = len(cp.link_history(INSTANCE))
    await send(cp, frame)
    await cp.wait_until(lambda: len(cp.link_history(INSTANCE)) > closed, timeout=20)
    await cp.wait_connected(INSTANCE, timeout=30)


async def fuzz(tmp_path: Any, drivers: Drivers, frames: list[Frame]) -> None:
    frames.insert(len(frames) // 2, oversized_command(MAX_FRAME - 256))  # big, but within the limit
    expected = {cid for f in frames if (cid := command_id_of(f)) is not None}
    async with control_plane(tmp_path) as cp:
        d = drivers.start(cp.url)
        await booted(cp)
        answered: set[str] = set()
        sub = cp.subscribe(INSTANCE)

        async def collect() -> None:
            with contextlib.suppress(StopAsyncIteration):
                while True:
                    item = await sub.get()
                    if item["type"] == "command.update":
                        answered.add(item["command_id"])

        collector = asyncio.ensure_future(collect())
        try:
            cid = await start_run(cp, "run-1", "[[flood:200:10]]")
            await wait_step(cp, "run-1", 3)
            for frame in frames:
                await send(cp, frame)
            await cp.wait_until(lambda: expected <= answered, timeout=60)
            assert (await status(cp, cid, timeout=60))["status"] == "completed"
            hb = await next_heartbeat(cp)
            check_run(
                cp,
                "run-1",
                terminal="run.completed",
                flood_steps=200,
                heartbeat_dropped=hb["outbox"]["best_effort_dropped"],
            )
            assert d.proc.poll() is None

            # Frames that end a link, one at a time.
            await ending_the_link(cp, (b'{"type": "command", "command_id": "\xff\xfe"}', True))  # invalid UTF-8: 1007
            await ending_the_link(
                cp, (b'{"type": "welcome", "connection_id": "again"}', True)
            )  # a second welcome: 4400
            await ending_the_link(cp, oversized_command(MAX_FRAME + 1024))  # over the limit: 1009
            cid2 = await start_run(cp, "run-2", "[[flood:5]]")
            assert (await status(cp, cid2, timeout=60))["status"] == "completed"
            assert d.proc.poll() is None
            assert "Traceback" not in d.stderr()
        finally:
            sub.close()
            collector.cancel()


async def test_cp_frame_fuzz(tmp_path: Any, drivers: Drivers) -> None:
    await fuzz(tmp_path, drivers, draw_frames(150, derandomize=True))


@pytest.mark.long
@pytest.mark.timeout(900)
async def test_cp_frame_fuzz_long(tmp_path: Any, drivers: Drivers) -> None:
    await fuzz(tmp_path, drivers, draw_frames(3000, derandomize=False))
