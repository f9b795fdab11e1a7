"""The start order of `agent-driver run` (issue 10's spawn → hello): the hello goes out before the
kernel's rooms are built and before the provider starts; what arrives before them waits; the cycle
collector, off during the start, is back on (with the start's objects frozen) once the rooms are up.

In-process (the kernel served in this test's event loop) so the order can be observed directly."""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from driver.boot import parse_payload
from driver.kernel.core import Kernel
from tests.integration.harness import INSTANCE, boot_payload, control_plane

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the driver's own loop


async def test_hello_before_rooms_then_the_collector_is_back(tmp_path: Path) -> None:
    async with control_plane(tmp_path) as cp:
        boot = parse_payload(json.dumps(boot_payload(tmp_path, cp.url)).encode())
        kernel = Kernel(boot, started_at=anyio.current_time())
        seen: dict[str, Any] = {}
        hello = kernel.hello

        def spying_hello() -> bytes:
            # What existed when the hello was built: no rooms yet.
            seen.setdefault("assembled", kernel.assembled.is_set())
            seen.setdefault("provider_started", kernel.__dict__.get("supervisor") is not None)
            return hello()

        kernel.hello = spying_hello  # type: ignore[method-assign]
        # A command queued before the driver connects arrives right after the welcome: it must wait
        # for the rooms and recovery, then be answered like any other.
        await cp.send_command(INSTANCE, "input.start", run_id="run-early", input={"text": "hi"})
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(kernel.serve)
                await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=30)
                assert gc.isenabled(), "the collector is back on once the rooms are up"
                assert gc.get_freeze_count() > 0, "the start's objects are frozen"
                terminal = await cp.wait_for_event(
                    INSTANCE,
                    lambda e: (
                        e.get("run_id") == "run-early" and e["kind"].startswith("run.") and e["kind"] != "run.started"
                    ),
                    timeout=30,
                )
                assert terminal["kind"] == "run.completed"
                await cp.send_command(INSTANCE, "session.stop", reason="test over")
                with anyio.fail_after(30):
                    await kernel.done.wait()
        finally:
            gc.unfreeze()
            if was_enabled:
                gc.enable()
    assert seen == {"assembled": False, "provider_started": False}
    assert kernel.assembled.is_set()
    timings = [e["payload"] for e in cp.events(INSTANCE) if e["kind"] == "runtime.timing.recorded"]
    phases = {t["phase"]: t["ms"] for t in timings}
    assert phases["hello"] <= phases["provider.spawn"]
