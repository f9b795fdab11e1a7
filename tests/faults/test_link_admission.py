"""The link never waits for admission (issue 19 item 4): the REAL driver, a full outbox, and final
rejections whose reports (lossless diagnostics) must be admitted into that full outbox.

The reader used to await the report's admission; only the sender (whose receipts the reader reads)
could make room, so the link waited on itself. Now reports are admitted by a task of their own.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.faults.conftest import Drivers
from tests.faults.history import check_instance
from tests.integration.harness import INSTANCE, control_plane

pytestmark = pytest.mark.faults


async def test_final_rejections_into_a_full_outbox_do_not_stall_the_link(tmp_path: Path, drivers: Drivers) -> None:
    async with control_plane(tmp_path) as cp:
        d = drivers.start(cp.url, outbox_max_events=8)
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=30)
        cp.faults.reject_retryable = False
        cp.faults.reject_next_events = 120  # every event of a long stretch of the flood, finally
        cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-r", input={"text": "[[flood:80:0]]"})
        st = await cp.wait_for_command_status(cid, timeout=60)
        assert st["status"] in ("completed", "failed")
        await cp.wait_for(
            INSTANCE, lambda i: i["type"] == "heartbeat" and i["outbox"]["lossless_pending"] == 0, timeout=30
        )
        rejected = [
            e for e in cp.events(INSTANCE, kinds=["diagnostic.reported"]) if e["payload"]["code"] == "event.rejected"
        ]
        assert rejected, "no final rejection was reported"
        assert d.proc.poll() is None
        check_instance(cp)
