"""PROTOCOL §6.8 through the real driver process and the reference control plane: terminals and
pipes beside the agent, their output with offsets, replay, and their ends."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.harness import INSTANCE, DriverProcess, control_plane
from tests.integration.processes_support import (
    command,
    screen,
    start_driver,
    start_process,
    wait_exited,
    wait_output,
)

pytestmark = pytest.mark.anyio


async def test_pty_echo_and_resize_seen_by_stty(tmp_path: Path, drivers: list[DriverProcess]) -> None:
    async with control_plane(tmp_path) as cp:
        start_driver(tmp_path, cp.url, drivers)
        await cp.wait_connected(INSTANCE, timeout=20)
        st = await start_process(cp, "term-1", argv=["/bin/sh"], pty={"cols": 100, "rows": 30})
        assert st["result"]["pid"] > 0
        started = await cp.wait_for_event(INSTANCE, lambda e: True, kinds="process.started")
        assert started["payload"]["pty"] == {"cols": 100, "rows": 30} and started["delivery"] == "lossless"
        assert (await command(cp, "process.input", process_id="term-1", data="stty size\n"))["status"] == "completed"
        await wait_output(cp, "term-1", "30 100")
        assert (await command(cp, "process.resize", process_id="term-1", cols=132, rows=50))["status"] == "completed"
        await command(cp, "process.input", process_id="term-1", data="stty size; echo ok-$((6*7))\n")
        out = await wait_output(cp, "term-1", "ok-42")
        assert "50 132" in out
        await command(cp, "process.input", process_id="term-1", data="exit 3\n")
        exited = await wait_exited(cp, "term-1")
        assert exited["exit_code"] == 3 and exited["signal"] is None, exited["tail"]
        assert "ok-42" in exited["tail"]
        text, gaps = screen(cp, "term-1")
        assert gaps == [] and len(text.encode()) == exited["output_bytes"]
