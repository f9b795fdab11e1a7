"""Without the mount namespace the driver's own folder is the agent's too (PROTOCOL §9, "Degraded
containment is stated per feature"; THREATS.md items 4 and 11): what the agent makes of the files the
driver keeps there (a fifo, a folder, a file where a folder should be) must fail the unit that meets
it, never freeze or end the driver, nor every later start on the same `state_dir`.

Through the REAL driver process (`AGENT_DRIVER_CONTAINMENT=subreaper`: `containment.degraded`) and our
stubborn ACP agent's `[[own-shell:]]` tool, a command run as the agent's own child."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.integration.harness import INSTANCE, boot_payload, control_plane
from tests.kernel.support import Driver, wait_diagnostic, wait_provider

DEGRADED = {
    "AGENT_DRIVER_CONTAINMENT": "subreaper",
    "AGENT_DRIVER_CANCEL_GRACE_MS": "300",
    "AGENT_DRIVER_TERM_GRACE_MS": "300",
    "AGENT_DRIVER_RESTART_BACKOFF_MS": "20",
    "AGENT_DRIVER_RESTART_BACKOFF_CAP_MS": "100",
}


async def run(cp: Any, run_id: str, text: str, timeout: float = 30) -> dict[str, Any]:
    cid, _ = await cp.send_command(INSTANCE, "input.start", run_id=run_id, input={"text": text})
    status: dict[str, Any] = await cp.wait_for_command_status(cid, timeout=timeout)
    return status


async def command(cp: Any, kind: str, **fields: Any) -> dict[str, Any]:
    cid, _ = await cp.send_command(INSTANCE, kind, **fields)
    status: dict[str, Any] = await cp.wait_for_command_status(cid, timeout=30)
    return status


async def test_a_fifo_at_the_process_records_temporary_name_does_not_freeze_the_driver(
    tmp_path: Path, drivers: list[Driver]
) -> None:
    """The driver rewrites `state_dir/driver/processes.json` (the pids its containment must kill after
    a crash) through `processes.tmp` at every provider start and exit. A fifo the agent left at that
    name held the driver's event loop in `open()` for writing, for good."""
    driver_dir = tmp_path / "state" / "driver"
    async with control_plane(tmp_path) as cp:
        d = Driver(tmp_path, boot_payload(tmp_path, cp.url), env=DEGRADED)
        drivers.append(d)
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=20)
        await wait_diagnostic(cp, "containment.degraded")
        await wait_provider(d)
        script = f"mkfifo {driver_dir}/processes.tmp && kill -9 $PPID"
        assert (await run(cp, "run-1", f"[[own-shell:{script}]]"))["status"] == "failed"
        assert (driver_dir / "processes.tmp").is_fifo()
        assert (await run(cp, "run-2", "[[say:still here]]"))["status"] == "completed"
        assert (await command(cp, "process.start", process_id="p1", argv=["true"]))["status"] == "completed"
        assert d.proc.poll() is None


async def test_what_the_agent_left_in_the_process_folders_does_not_brick_later_starts(
    tmp_path: Path, drivers: list[Driver]
) -> None:
    """At start the driver reads the process record and the §6.8 rings' records a dead (killed)
    predecessor left. The agent leaves fifos there, a sparse giant as a ring's record, and a ring name that is a
    folder: the next start on the same `state_dir` must start and serve (before: it froze in `open()`)."""
    driver_dir = tmp_path / "state" / "driver"
    async with control_plane(tmp_path) as cp:
        d = Driver(tmp_path, boot_payload(tmp_path, cp.url), env=DEGRADED)
        drivers.append(d)
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=20)
        rings = driver_dir / "processes"
        script = (
            f"mkfifo {rings}/a.json && truncate -s 8G {rings}/b.json && mkdir {rings}/c.json"
            f" && rm -f {driver_dir}/processes.json && mkfifo {driver_dir}/processes.json"
        )
        assert (await run(cp, "run-1", f"[[own-shell:{script}]]"))["status"] == "completed"
        assert (rings / "a.json").is_fifo() and (driver_dir / "processes.json").is_fifo()
        d.kill()  # the driver dies (SIGKILL): what the agent left is what the next start reads
    async with control_plane(tmp_path) as cp:
        again = Driver(tmp_path, boot_payload(tmp_path, cp.url), env=DEGRADED, name="driver-2")
        drivers.append(again)
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=20)
        assert (await run(cp, "run-2", "[[say:up]]"))["status"] == "completed"
        assert (await command(cp, "process.start", process_id="p1", argv=["true"]))["status"] == "completed"
        assert again.proc.poll() is None
