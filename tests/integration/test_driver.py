"""The driver process end to end against the reference control plane (real stubborn ACP agent)."""

from __future__ import annotations

import json
import signal
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import INSTANCE, TOKEN, DriverProcess, boot_payload, control_plane, kinds

pytestmark = pytest.mark.anyio


def start(tmp_path: Path, url: str, drivers: list[DriverProcess], name: str = "driver", **kw: Any) -> DriverProcess:
    d = DriverProcess(tmp_path, boot_payload(tmp_path, url, **kw), name)
    drivers.append(d)
    return d


async def run_input(cp: Any, text: str, run_id: str) -> tuple[str, dict[str, Any]]:
    cid, _ = await cp.send_command(INSTANCE, "input.start", run_id=run_id, input={"text": text})
    status = await cp.wait_for_command_status(cid, timeout=30)
    return cid, status


async def test_hello_started_and_a_run_end_to_end(tmp_path: Path, drivers: list[DriverProcess]) -> None:
    async with control_plane(tmp_path) as cp:
        d = start(tmp_path, cp.url, drivers)
        await cp.wait_connected(INSTANCE, timeout=20)
        hello = cp.hello(INSTANCE)
        assert hello is not None
        assert hello["epoch"] == 1 and hello["last_command_seq"] == 0 and hello["runtime"] == "acp"
        started = await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=20)
        assert started["payload"]["epoch"] == 1
        assert not d.boot.exists()

        cid, status = await run_input(cp, "[[say:hi there]]", "run-1")
        assert status["status"] == "completed"
        # Exactly one `accepted`, within 1 s of the command being queued, then one terminal status.
        updates = cp.command_updates(cid)
        assert [u["status"] for u in updates] == ["accepted", "completed"]
        queued = datetime.fromisoformat(status["created_at"])
        assert datetime.fromisoformat(updates[0]["received_at"]) - queued < timedelta(seconds=1)
        evs = cp.events(INSTANCE, run_id="run-1")
        ks = kinds(evs)
        assert ks[0] == "run.started" and ks[-1] == "run.completed"
        assert ks.count("run.completed") == 1
        final = evs[-1]["payload"]
        assert final["final_message_text"] == "hi there"
        completed = [e for e in evs if e["kind"] == "message.completed"]
        assert completed and completed[-1]["payload"]["text"] == "hi there"
        seqs = [e["seq"] for e in evs]
        assert seqs == sorted(seqs)
        assert all(e["epoch"] == 1 and e["session_id"] == "ses-it" for e in evs)


async def test_commands_idempotent_conflicting_invalid_and_run_active(
    tmp_path: Path, drivers: list[DriverProcess]
) -> None:
    async with control_plane(tmp_path) as cp:
        start(tmp_path, cp.url, drivers)
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=20)
        cid, status = await run_input(cp, "[[say:once]]", "run-a")
        assert status["status"] == "completed"

        # The same command again: not executed twice, the terminal status is resent.
        before = len(cp.command_updates(cid))
        await cp.resend_command(cid)
        await cp.wait_until(lambda: len(cp.command_updates(cid)) > before, timeout=10)
        assert cp.command_updates(cid)[-1]["status"] == "completed"
        assert kinds(cp.events(INSTANCE, run_id="run-a")).count("run.started") == 1

        # Same id, other content → command.conflict.
        cmd = cp.command(cid)
        assert cmd is not None
        body = dict(cmd["body"])
        body["input"] = {"text": "something else"}
        await cp.send_raw(INSTANCE, body)
        await cp.wait_until(
            lambda: any((u.get("error") or {}).get("code") == "command.conflict" for u in cp.command_updates(cid)),
            timeout=10,
        )

        # Unknown kind and a missing field → command.invalid; the driver carries on.
        bad, _ = await cp.send_command(INSTANCE, "rm.rf", path="/")
        st = await cp.wait_for_command_status(bad, timeout=10)
        assert st["status"] == "failed" and st["error"]["code"] == "command.invalid"
        bad2, _ = await cp.send_command(INSTANCE, "turn.cancel")
        st2 = await cp.wait_for_command_status(bad2, timeout=10)
        assert st2["error"]["code"] == "command.invalid" and "run_id" in st2["error"]["message"]

        # One run at a time.
        slow, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-slow", input={"text": "[[slow]]"})
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "run.started" and e["run_id"] == "run-slow")
        second, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-2", input={"text": "hi"})
        st3 = await cp.wait_for_command_status(second, timeout=10)
        assert st3["error"]["code"] == "driver.run_active" and st3["error"]["retryable"] is True

        cancel, _ = await cp.send_command(INSTANCE, "turn.cancel", run_id="run-slow", reason="user")
        st4 = await cp.wait_for_command_status(cancel, timeout=20)
        assert st4["status"] == "completed"
        st5 = await cp.wait_for_command_status(slow, timeout=20)
        assert st5["status"] == "cancelled"
        terminal = cp.events(INSTANCE, run_id="run-slow")[-1]
        assert terminal["kind"] == "run.cancelled"
        assert terminal["payload"]["requested_by"] == "control_plane"
        assert terminal["payload"]["details"]["phase"] == "interrupt"

        # Cancel of a run that is already terminal.
        again, _ = await cp.send_command(INSTANCE, "turn.cancel", run_id="run-slow")
        st6 = await cp.wait_for_command_status(again, timeout=10)
        assert st6["status"] == "completed" and st6["result"] == {"already_terminal": True}

        # And the driver still works.
        _, st7 = await run_input(cp, "[[say:still here]]", "run-3")
        assert st7["status"] == "completed"


async def test_session_stop_drains_and_exits_zero(tmp_path: Path, drivers: list[DriverProcess]) -> None:
    async with control_plane(tmp_path) as cp:
        d = start(tmp_path, cp.url, drivers)
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=20)
        await run_input(cp, "hello", "run-1")
        # A heartbeat sent while the provider was still starting may be the latest for a moment: wait for
        # the first one after the run, which must say `ready`.
        await cp.wait_until(lambda: (cp.last_heartbeat(INSTANCE) or {}).get("state") == "ready", timeout=15)
        hb = cp.last_heartbeat(INSTANCE)
        assert hb is not None and hb["outbox"]["lossless_pending"] >= 0
        stop, _ = await cp.send_command(INSTANCE, "session.stop", reason="done")
        assert await d.wait(30) == 0
        st = cp.command(stop)
        assert st is not None and st["status"] == "completed"
        logs = d.stderr()
        # Outbox statistics reach the logs at link changes and at stop.
        opened = [json.loads(line) for line in logs.splitlines() if '"link.open"' in line]
        assert opened and "lossless_pending" in opened[0]["outbox"] and "retries" in opened[0]["outbox"]
        assert any('"driver.stopping"' in line and '"outbox"' in line for line in logs.splitlines())
        assert TOKEN not in logs
        assert "provider-secret-777" not in logs


@pytest.mark.parametrize(("code", "status"), [(4401, 77), (4403, 77), (4409, 75), (4410, 0)])
async def test_close_codes_end_the_process(
    tmp_path: Path, drivers: list[DriverProcess], code: int, status: int
) -> None:
    async with control_plane(tmp_path) as cp:
        d = start(tmp_path, cp.url, drivers)
        await cp.wait_connected(INSTANCE, timeout=20)
        await cp.close_link(INSTANCE, code, "test")
        assert await d.wait(30) == status


async def test_reconnects_after_abnormal_close_and_resends(tmp_path: Path, drivers: list[DriverProcess]) -> None:
    async with control_plane(tmp_path) as cp:
        start(tmp_path, cp.url, drivers)
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=20)
        first = cp.hello(INSTANCE)
        await cp.close_link(INSTANCE, 1011, "boom")
        await cp.wait_disconnected(INSTANCE, timeout=10)
        await cp.wait_connected(INSTANCE, timeout=20)
        second = cp.hello(INSTANCE)
        assert first is not None and second is not None and second["epoch"] == first["epoch"]
        _, st = await run_input(cp, "[[say:after reconnect]]", "run-r")
        assert st["status"] == "completed"


async def test_sigkill_mid_run_restart_ends_run_and_resends(tmp_path: Path, drivers: list[DriverProcess]) -> None:
    async with control_plane(tmp_path) as cp:
        d = start(tmp_path, cp.url, drivers)
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=20)
        cp.faults.withhold_receipts = True
        cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-k", input={"text": "[[slow]]"})
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "run.started" and e["run_id"] == "run-k")
        d.kill()
        cp.faults.withhold_receipts = False
        d2 = start(tmp_path, cp.url, drivers, name="driver2")
        term = await cp.wait_for_event(
            INSTANCE,
            lambda e: e["run_id"] == "run-k" and e["kind"].startswith("run.") and e["kind"] != "run.started",
            timeout=30,
        )
        assert term["kind"] == "run.failed"
        assert term["payload"]["error"]["code"] == "driver.restarted"
        hello = cp.hello(INSTANCE)
        assert hello is not None and hello["epoch"] == 2
        st = await cp.wait_for_command_status(cid, timeout=20)
        assert st["status"] == "failed" and st["error"]["code"] == "driver.restarted"
        evs = cp.events(INSTANCE, run_id="run-k")
        assert kinds(evs).count("run.started") == 1
        assert [k for k in kinds(evs) if k in ("run.completed", "run.failed", "run.cancelled")] == ["run.failed"]
        d2.signal(signal.SIGTERM)
        assert await d2.wait(30) == 0
