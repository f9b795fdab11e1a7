"""Telemetry events through the real driver process: `runtime.timing.recorded` (cold, then resume in a
second process on the same state_dir), `log.records` with the lines from before the first welcome,
and the resource guard (`diagnostic.reported{provider.recycled}` between runs, resuming the session)."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import anyio

from tests.integration.harness import INSTANCE, TOKEN, boot_payload, control_plane
from tests.kernel.support import Driver, wait_diagnostic, wait_provider
from tests.kernel.test_supervision import FAST, run, start


def start_with_limits(tmp: Path, url: str, drivers: list[Driver], limits: dict[str, Any]) -> Driver:
    payload = boot_payload(tmp, url)
    payload["execution"]["limits"] = limits
    d = Driver(tmp, payload, env=FAST)
    drivers.append(d)
    return d


def _timings(cp: Any) -> list[dict[str, Any]]:
    return [e["payload"] for e in cp.events(INSTANCE) if e["kind"] == "runtime.timing.recorded"]


async def _wait_timing(cp: Any, phase: str, after_seq: int = 0) -> dict[str, Any]:
    event: dict[str, Any] = await cp.wait_for_event(
        INSTANCE,
        lambda e: e["kind"] == "runtime.timing.recorded" and e["payload"]["phase"] == phase and e["seq"] > after_seq,
        timeout=20,
    )
    return event


async def test_timings_cold_then_resume_in_a_new_process(tmp_path: Path, drivers: list[Driver]) -> None:
    async with control_plane(tmp_path) as cp:
        d = start(tmp_path, cp.url, drivers)
        assert (await run(cp, "run-1", "[[say:hi]]"))["status"] == "completed"
        first_token = await _wait_timing(cp, "first_token")
        assert first_token["payload"]["run_id"] == "run-1" and first_token["payload"]["mode"] == "cold"
        assert 0 < first_token["payload"]["ms"] < 10_000
        by_phase = {t["phase"]: t for t in _timings(cp)}
        assert set(by_phase) == {"hello", "provider.spawn", "session.open", "provider.ready", "first_token"}
        assert all(t["mode"] == "cold" for t in by_phase.values())
        # Since process start, so they include the interpreter's own start and come in order.
        assert by_phase["hello"]["ms"] > 0
        # The hello goes out before the rooms are built and the provider's start begins (issue 10).
        assert by_phase["hello"]["ms"] <= by_phase["provider.spawn"]["ms"]
        assert by_phase["provider.spawn"]["ms"] <= by_phase["provider.ready"]["ms"]
        assert by_phase["session.open"]["ms"] <= by_phase["provider.ready"]["ms"]
        # A new driver process on the same state_dir: warm, and the journaled session is resumed.
        await cp.send_command(INSTANCE, "session.stop", reason="restart")
        assert await d.wait() == 0
        last = max(e["seq"] for e in cp.events(INSTANCE))
        start(tmp_path, cp.url, drivers)
        ready = await _wait_timing(cp, "provider.ready", after_seq=last)
        modes = {
            e["payload"]["phase"]: e["payload"]["mode"]
            for e in cp.events(INSTANCE, kinds="runtime.timing.recorded")
            if e["seq"] > last
        }
        assert modes == {
            "hello": "warm",
            "provider.spawn": "warm",
            "session.resume": "resume",
            "provider.ready": "resume",
        }
        assert ready["payload"]["mode"] == "resume"
        assert (await run(cp, "run-2", "[[say:again]]"))["status"] == "completed"
        token2 = await _wait_timing(cp, "first_token", after_seq=ready["seq"])
        assert token2["payload"]["run_id"] == "run-2" and token2["payload"]["mode"] == "resume"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_log_lines_from_before_the_first_welcome_are_delivered(tmp_path: Path, drivers: list[Driver]) -> None:
    port = _free_port()
    # The driver starts first and fails to dial (logging it) until the control plane exists.
    d = start(tmp_path, f"ws://127.0.0.1:{port}/driver", drivers)
    with anyio.fail_after(30):
        while "link.dial_failed" not in d.stderr():  # noqa: ASYNC110 (no event announces a log line: poll)
            await anyio.sleep(0.05)
    async with control_plane(tmp_path, port=port) as cp:
        event = await cp.wait_for_event(
            INSTANCE,
            lambda e: (
                e["kind"] == "log.records" and any(r["message"] == "link.dial_failed" for r in e["payload"]["records"])
            ),
            timeout=40,
        )
        assert event["delivery"] == "best_effort"
        record = next(r for r in event["payload"]["records"] if r["message"] == "link.dial_failed")
        assert record["logger"] == "driver.link" and record["level"] == "warning"
        assert record["at"].endswith("Z") and "error" in record["fields"]
        assert record["at"] <= event["occurred_at"]  # logged before the batch that carried it
        stored = json.dumps([e["payload"] for e in cp.events(INSTANCE) if e["kind"] == "log.records"])
        assert TOKEN not in stored  # the lines are the redacted ones
        assert "Authorization" not in stored
        d.signal(15)
        assert await d.wait() == 0


async def test_provider_above_its_rss_limit_is_recycled_between_runs_resuming_the_session(
    tmp_path: Path, drivers: list[Driver]
) -> None:
    async with control_plane(tmp_path) as cp:
        d = start_with_limits(tmp_path, cp.url, drivers, {"provider_rss_mb": 64})
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=20)
        first = await wait_provider(d)
        opened = await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "runtime.resume.updated", timeout=20)
        session_id = opened["payload"]["value"]
        assert (await run(cp, "run-small", "[[say:small]]"))["status"] == "completed"
        diagnostics = [e["payload"]["code"] for e in cp.events(INSTANCE) if e["kind"] == "diagnostic.reported"]
        assert "provider.recycled" not in diagnostics  # under the limit
        # The run that grows the provider completes normally: never replaced during a run.
        status = await run(cp, "run-grow", "[[grow:96]]")
        assert status["status"] == "completed"
        recycled = await wait_diagnostic(cp, "provider.recycled")
        details = recycled["payload"]["details"]
        assert details["rss_mb"] > 64 and details["limit_mb"] == 64 and details["after_run_id"] == "run-grow"
        assert details["resumes"] == session_id
        second = await wait_provider(d, exclude=(first,))
        assert second != first
        # The replacement resumed the current native session (session/load of the same id).
        reply = await run(cp, "run-after", "[[session]]")
        assert reply["status"] == "completed"
        (done,) = [e for e in cp.events(INSTANCE, run_id="run-after") if e["kind"] == "run.completed"]
        assert json.loads(done["payload"]["final_message_text"])["sessionId"] == session_id
        # The warning line was mirrored as a lossless diagnostic.
        mirrored = await wait_diagnostic(cp, "driver.log")
        assert mirrored["payload"]["severity"] == "warning"
        assert mirrored["payload"]["message"] == "driver.telemetry: provider.recycled"
