"""PROTOCOL §9, "Degraded containment is stated per feature", through the real driver process: without a
mount namespace (`AGENT_DRIVER_CONTAINMENT=subreaper`, so `containment.degraded`) the provider tree can
write the driver's files, and a test ACP agent's shell tool (its `terminal/*` commands, run by the
driver in the provider's containment) attacks each feature that persists there. Each feature either
authenticates what it persists (the §6.8 rings, the handover's lock) or is refused (the keeper)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import INSTANCE, DriverProcess, control_plane
from tests.kernel import runtimes
from tests.kernel.runtimes import Fakes
from tests.kernel.support import Driver, wait_diagnostic, wait_terminal

pytestmark = pytest.mark.provider

DEGRADED = {"AGENT_DRIVER_CONTAINMENT": "subreaper"}


async def command(cp: Any, kind: str, **fields: Any) -> dict[str, Any]:
    cid, _ = await cp.send_command(INSTANCE, kind, **fields)
    status: dict[str, Any] = await cp.wait_for_command_status(cid, timeout=30)
    return status


async def agent_shell(cp: Any, run_id: str, script: str) -> None:
    """The agent runs `script` with its shell tool (no `]]` in it: it sits in a [[shell:]])."""
    await cp.send_command(INSTANCE, "input.start", run_id=run_id, input={"text": f"[[shell:{script}]]"})
    term = await wait_terminal(cp, run_id, timeout=60)
    assert term["kind"] == "run.completed", term


def stubborn(tmp: Path, url: str, fakes: Fakes) -> dict[str, Any]:
    payload = runtimes.payload("acp:stubborn", tmp, url, fakes)
    payload["execution"]["permission_policy"] = "full_access"
    return payload


async def test_a_ring_the_agent_rewrote_is_never_replayed(tmp_path: Path, fakes: Fakes) -> None:
    """The agent overwrites a process's output ring (`state_dir/driver/processes/*.ring`, visible here):
    `process.replay` sends none of its bytes (`process.ring_tampered`) and `journal.tampered` says so."""
    rings = tmp_path / "state" / "driver" / "processes"
    async with control_plane(tmp_path) as cp:
        d = Driver(tmp_path, stubborn(tmp_path, cp.url, fakes), env=DEGRADED)
        try:
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=60)
            st = await command(cp, "process.start", process_id="p1", argv=["sh", "-c", "echo ORIGINAL-LINE"])
            assert st["status"] == "completed", st
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "process.exited", timeout=20)
            forged = "FORGED-BY-AGENT"
            await agent_shell(
                cp,
                "run-1",
                f"for f in {rings}/*.ring; do printf {forged} | dd of=$f bs=1 seek=0 conv=notrunc 2>/dev/null; done; "
                f"ls {rings} > {tmp_path / 'cwd' / 'seen.txt'}",
            )
            assert ".ring" in (tmp_path / "cwd" / "seen.txt").read_text()  # the tool did reach the ring
            st = await command(cp, "process.replay", process_id="p1", from_offset=0)
            assert st["status"] == "failed" and st["error"]["code"] == "process.ring_tampered", st
            sent = [e["payload"]["data"] for e in cp.events(INSTANCE, "process.output")]
            assert not any(forged in s for s in sent), sent
            diag = await wait_diagnostic(cp, "journal.tampered")
            assert diag["payload"]["details"]["table"] == "process_rings"
            # The driver goes on: a new process's output replays.
            st = await command(cp, "process.start", process_id="p2", argv=["sh", "-c", "echo SECOND-LINE"])
            await cp.wait_until(
                lambda: any("SECOND-LINE" in e["payload"]["data"] for e in cp.events(INSTANCE, "process.output")), 20
            )
            st = await command(cp, "process.replay", process_id="p2", from_offset=0)
            assert st["status"] == "completed", st
        finally:
            d.close()


async def test_handover_never_signals_a_pid_the_agent_wrote_into_the_lock(tmp_path: Path, fakes: Fakes) -> None:
    """The agent writes another process's pid into `state_dir/driver.lock` (visible here): `--handover`
    signals only a holder whose record carries the driver's MAC and still names a running driver, so the
    victim lives, and the successor says at once that the lock names no driver it can verify (exit 75)."""
    victim = subprocess.Popen(["sleep", "300"])  # noqa: ASYNC220 (a victim process; starting it does not block)
    try:
        async with control_plane(tmp_path) as cp:
            payload = stubborn(tmp_path, cp.url, fakes)
            d = Driver(tmp_path, payload, env=DEGRADED)
            try:
                await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=60)
                lock = tmp_path / "state" / "driver.lock"
                await agent_shell(cp, "run-1", f"echo {victim.pid} > {lock}")
                assert lock.read_text().split() == [str(victim.pid)]  # the tool did write it
                successor = DriverProcess(tmp_path, payload, "successor", DEGRADED, ("--handover",))
                try:
                    assert await successor.wait(timeout=20) == 75
                finally:
                    successor.kill()
                assert "names no driver process that can be verified" in successor.stderr()
                assert victim.poll() is None, "the victim was signalled"
                assert d.proc.poll() is None  # and the real driver was not asked either: it goes on
                assert (await command(cp, "process.start", process_id="p", argv=["true"]))["status"] == "completed"
            finally:
                d.close()
    finally:
        victim.kill()
        victim.wait()


@pytest.mark.parametrize("plant", ["mkfifo {f}", "truncate -s 1G {f}"], ids=["fifo", "sparse-giant"])
async def test_a_keeper_record_the_agent_planted_never_holds_the_next_start(
    tmp_path: Path, fakes: Fakes, plant: str
) -> None:
    """The keeper is refused here, but every start looks for a predecessor's keeper record
    (`state_dir/driver/keeper/record.json`, visible here). The agent plants a fifo there (the read
    blocked for good: the next driver never reached `driver.started`) or a 1 GiB sparse file (read
    whole into the driver before its MAC was checked: its peak RSS passed 1 GiB): the next start
    refuses it as not the driver's own (`journal.tampered{table: keeper}`) and goes on."""
    record = tmp_path / "state" / "driver" / "keeper" / "record.json"
    async with control_plane(tmp_path) as cp:
        payload = stubborn(tmp_path, cp.url, fakes)
        d = Driver(tmp_path, payload, env=DEGRADED)
        try:
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=60)
            await agent_shell(cp, "run-1", f"mkdir -p {record.parent} && {plant.format(f=record)}")
            assert record.exists() or record.is_fifo()  # the tool did plant it
        finally:
            d.close()
        successor = Driver(tmp_path, payload, "successor", env=DEGRADED)
        try:
            await cp.wait_until(lambda: len(cp.events(INSTANCE, "driver.started")) == 2, 60)
            diag = await wait_diagnostic(cp, "journal.tampered")
            assert diag["payload"]["details"]["table"] == "keeper", diag
            await agent_shell(cp, "run-2", "true")
            peak = next(
                int(line.split()[1])
                for line in Path(f"/proc/{successor.pid}/status").read_text().splitlines()
                if line.startswith("VmHWM:")
            )
            assert peak < 400 * 1024, f"the successor's peak RSS was {peak} KiB"
        finally:
            successor.close()
