"""PROTOCOL §4.3 through the real driver process and the reference control plane: a huge tool
output costs one truncated event, and a CP that refuses a frame with 1009 never gets it again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from tests.integration.harness import INSTANCE, DriverProcess, boot_payload, control_plane

pytestmark = pytest.mark.anyio

MIB = 1024 * 1024


async def _run(cp: Any, text: str, run_id: str) -> dict[str, Any]:
    cid, _ = await cp.send_command(INSTANCE, "input.start", run_id=run_id, input={"text": text})
    status: dict[str, Any] = await cp.wait_for_command_status(cid, timeout=120)
    return status


def _truncated(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if "truncated" in e["payload"]]


@pytest.mark.parametrize("shape", ["bigtool", "bignested"])
async def test_a_20_mib_tool_output_is_one_truncated_event_and_the_run_completes(
    shape: str, tmp_path: Path, drivers: list[DriverProcess]
) -> None:
    async with control_plane(tmp_path) as cp:
        d = DriverProcess(tmp_path, boot_payload(tmp_path, cp.url))
        drivers.append(d)
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=30)
        status = await _run(cp, f"[[{shape}:{20 * MIB}]]", "run-big")
        assert status["status"] == "completed"
        events = cp.events(INSTANCE, run_id="run-big")
        assert [e["kind"] for e in events][-1] == "run.completed"
        assert events[-1]["payload"]["final_message_text"] == f"big {20 * MIB}"
        cut = _truncated(events)
        assert [e["kind"] for e in cut] == ["tool.completed"]
        payload = cut[0]["payload"]
        assert payload["truncated"]["original_bytes"] > 20 * MIB
        assert len(msgspec.json.encode(payload)) <= 256 * 1024  # the default max_event_bytes
        assert payload["status"] == "completed" and payload["tool_call_id"].startswith("call-")
        # The link carried on: a later run is not stuck behind anything.
        assert (await _run(cp, "[[say:after]]", "run-after"))["status"] == "completed"


@pytest.mark.faults
async def test_a_cp_closing_1009_gets_smaller_frames_and_never_the_refused_one(
    tmp_path: Path, drivers: list[DriverProcess]
) -> None:
    # The CP announces 1 MiB batches but refuses any frame over 48 KiB with 1009. A 200 KiB tool
    # output fits max_event_bytes, so it is admitted whole; its frame is refused; the driver halves
    # its batch size until the event, cut to fit, goes through.
    async with control_plane(tmp_path) as cp:
        cp.faults.max_frame_bytes = 48 * 1024
        d = DriverProcess(tmp_path, boot_payload(tmp_path, cp.url))
        drivers.append(d)
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=30)
        status = await _run(cp, f"[[bigtool:{200 * 1024}]]", "run-1009")
        assert status["status"] == "completed"
        refused = cp.refused_frames
        assert refused, "the fault knob never refused a frame"
        assert refused == sorted(refused, reverse=True) and len(set(refused)) == len(refused)
        assert len(refused) <= 4  # halving from ~200 KiB reaches 48 KiB within a few closes
        events = cp.events(INSTANCE, run_id="run-1009")
        tools = [e for e in events if e["kind"] == "tool.completed"]
        assert len(tools) == 1 and tools[0]["payload"]["truncated"]["original_bytes"] > 200 * 1024
        assert [e["kind"] for e in events][-1] == "run.completed"
        assert "link.too_big" in d.stderr()
