"""The supervision boundary (issue 19 item 2, PROTOCOL §9), through the REAL driver process with faults
injected from outside (tests/faults/inject/sitecustomize.py replaces driver functions with ones that
raise): an unexpected error in a run, a report, a command, a kernel task or a link task fails that
unit only, with a lossless `diagnostic.reported{driver.internal_error}` naming the exception type and a
redacted message, and the driver carries on. A failure the driver cannot contain (its journal writer)
exits 70, one of the README's statuses, never 1 with a traceback."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.faults.test_faults import booted, status
from tests.integration.harness import INSTANCE, DriverProcess, boot_payload, control_plane

pytestmark = pytest.mark.faults

INJECT = Path(__file__).resolve().parent / "inject"
SECRET = "provider-secret-777"  # the harness's execution.environment value: the redactor knows it


def injected(faults: str) -> dict[str, str]:
    path = os.pathsep.join([str(INJECT), os.environ.get("PYTHONPATH", "")])
    return {"PYTHONPATH": path, "INJECT_FAULTS": faults, "INJECT_SECRET": SECRET}


async def internal_error(cp: Any, unit: str, timeout: float = 20) -> dict[str, Any]:
    event = await cp.wait_for_event(
        INSTANCE,
        lambda e: e["kind"] == "diagnostic.reported"
        and e["payload"]["code"] == "driver.internal_error"
        and e["payload"]["details"]["unit"] == unit,
        timeout=timeout,
    )
    payload: dict[str, Any] = event["payload"]
    assert event["delivery"] == "lossless"
    assert payload["severity"] == "error"
    assert payload["details"]["exception_type"] == "Injected"
    return payload


async def test_each_unit_fails_alone_and_the_driver_carries_on(tmp_path: Path) -> None:
    async with control_plane(tmp_path) as cp:
        env = injected("run,scan,permission,telemetry,heartbeat")
        d = DriverProcess(tmp_path, boot_payload(tmp_path, cp.url), extra_env=env)
        try:
            await booted(cp)
            # A long-lived kernel task: reported, restarted.
            telemetry = await internal_error(cp, "task telemetry")
            assert telemetry["details"]["restarting_in_s"] > 0
            # A task of the link's connection: that connection ends (1011), the next one carries on.
            await cp.wait_until(lambda: any(h["close_code"] == 1011 for h in cp.link_history(INSTANCE)), timeout=20)
            await cp.wait_connected(INSTANCE, timeout=20)

            # A run: run.failed{driver.internal_error}, its input.start fails the same, redacted.
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-boom", input={"text": "[[boom]]"})
            st = await status(cp, cid, timeout=30)
            assert st["status"] == "failed" and st["error"]["code"] == "driver.internal_error", st
            [failed] = cp.events(INSTANCE, kinds="run.failed", run_id="run-boom")
            assert failed["payload"]["error"]["code"] == "driver.internal_error"
            run = await internal_error(cp, "run")
            assert SECRET not in str(run) and SECRET not in str(st) and SECRET not in str(failed)
            assert "[redacted]" in run["message"] and "Injected" in run["message"]

            # A report: the side-effects scan fails, the run completes all the same.
            (tmp_path / "cwd" / "boom-scan").write_text("")
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-scan", input={"text": "[[say:x]]"})
            assert (await status(cp, cid, timeout=30))["status"] == "completed"
            await internal_error(cp, "side effects scan")
            (tmp_path / "cwd" / "boom-scan").unlink()

            # A command: permission.resolve fails driver.internal_error; a good answer still works.
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-perm", input={"text": "[[perm]]"})
            asked = await cp.wait_for_event(
                INSTANCE, lambda e: e["kind"] == "permission.requested" and e["run_id"] == "run-perm", timeout=30
            )
            request_id = asked["payload"]["request_id"]
            bad, _ = await cp.send_command(INSTANCE, "permission.resolve", request_id=request_id, option_id="boom")
            st = await status(cp, bad, timeout=20)
            assert st["status"] == "failed" and st["error"]["code"] == "driver.internal_error", st
            await internal_error(cp, "command permission.resolve")
            option = asked["payload"]["options"][0]["option_id"]
            good, _ = await cp.send_command(INSTANCE, "permission.resolve", request_id=request_id, option_id=option)
            assert (await status(cp, good, timeout=20))["status"] == "completed"
            assert (await status(cp, cid, timeout=30))["status"] == "completed"

            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-ok", input={"text": "[[say:ok]]"})
            assert (await status(cp, cid, timeout=30))["status"] == "completed"
            assert d.proc.poll() is None
            assert SECRET not in d.stderr()
        finally:
            d.close()


async def test_a_fault_the_driver_cannot_contain_exits_70_not_1(tmp_path: Path) -> None:
    async with control_plane(tmp_path) as cp:
        d = DriverProcess(tmp_path, boot_payload(tmp_path, cp.url), extra_env=injected("outbox"))
        try:
            assert await d.wait(timeout=30) == 70
            err = d.stderr()
            assert '"driver.internal_error"' in err and "task outbox" in err
        finally:
            d.close()
