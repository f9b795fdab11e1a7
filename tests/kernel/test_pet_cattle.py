"""PROTOCOL §7 through the real driver process: cattle idles out (exit 0, outbox drained), a pet never
does, `memory_dir` is never written or deleted by the driver, and two drivers with their own instance
ids and state_dirs run side by side in one sandbox.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

import anyio
from agent_lab.controlplane.server import ControlPlane

from tests.integration.harness import INSTANCE, TOKEN, boot_payload
from tests.kernel.support import Driver


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every entry under `root` with its size and mtime (ns): what the driver must leave alone."""
    out: dict[str, tuple[int, int]] = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        out[str(path.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


def memory(tmp: Path) -> Path:
    mem = tmp / "memory"
    (mem / "notes").mkdir(parents=True, exist_ok=True)
    (mem / "notes" / "remember.md").write_text("the user likes teal\n")
    (mem / "keep.bin").write_bytes(os.urandom(64))
    return mem


async def turn(cp: ControlPlane, instance: str, run_id: str, text: str) -> dict[str, Any]:
    cid, _ = await cp.send_command(instance, "input.start", run_id=run_id, input={"text": text})
    status: dict[str, Any] = await cp.wait_for_command_status(cid, timeout=30)
    return status


async def test_cattle_exits_after_idle_with_its_outbox_drained(tmp_path: Path) -> None:
    async with ControlPlane(tmp_path / "cp.sqlite3", tokens={TOKEN: {INSTANCE}}, heartbeat_interval_ms=500) as cp:
        mem = memory(tmp_path)
        before = tree(mem)
        d = Driver(tmp_path, boot_payload(tmp_path, cp.url, idle_exit_ms=1500, memory_dir=str(mem)))
        try:
            assert (await turn(cp, INSTANCE, "run-1", "[[write:out.txt:x]]"))["status"] in ("completed", "failed")
            # Idle from the run's terminal on: the driver stops by itself, cleanly.
            assert await d.wait(30) == 0
            stopped = [e for e in cp.events(INSTANCE) if e["kind"] == "diagnostic.reported"]
            assert all(e["payload"]["code"] != "driver.drain_timeout" for e in stopped)
            # Exit 0 means drained: nothing was left journaled for a next process to send.
            db = sqlite3.connect(tmp_path / "state" / "driver" / "journal.sqlite3")
            assert db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0] == 0
            db.close()
            assert tree(mem) == before
        finally:
            d.close()


async def test_pet_never_idles_out_and_keeps_memory_dir(tmp_path: Path) -> None:
    async with ControlPlane(tmp_path / "cp.sqlite3", tokens={TOKEN: {INSTANCE}}, heartbeat_interval_ms=500) as cp:
        mem = memory(tmp_path)
        before = tree(mem)
        # Even with an idle bound in its payload, a pet stays until session.stop.
        d = Driver(tmp_path, boot_payload(tmp_path, cp.url, kind="pet", idle_exit_ms=300, memory_dir=str(mem)))
        try:
            assert (await turn(cp, INSTANCE, "run-1", "hello"))["status"] == "completed"
            # Ten idle periods: a cattle would have exited long ago (this wait is the test's subject).
            with anyio.move_on_after(3.0):
                await d.wait(10)
            assert d.proc.poll() is None, "a pet exited on its own"
            assert (await turn(cp, INSTANCE, "run-2", "[[read:../memory/notes/remember.md]]"))["status"] == "completed"
            run2 = cp.events(INSTANCE, run_id="run-2")
            said = [e["payload"]["text"] for e in run2 if e["kind"] == "message.completed"]
            assert said == ["read: the user likes teal\n"], said  # the agent may read memory_dir
            cid, _ = await cp.send_command(INSTANCE, "session.stop", reason="done")
            assert (await cp.wait_for_command_status(cid, timeout=30))["status"] == "completed"
            assert await d.wait(30) == 0
            assert tree(mem) == before
        finally:
            d.close()


async def test_two_drivers_side_by_side_in_one_sandbox(tmp_path: Path) -> None:
    other = "drv-it.2"
    tokens = {TOKEN: {INSTANCE, other}}
    async with ControlPlane(tmp_path / "cp.sqlite3", tokens=tokens, heartbeat_interval_ms=500) as cp:
        a_dir, b_dir = tmp_path / "a", tmp_path / "b"
        a_dir.mkdir()
        b_dir.mkdir()
        pa = boot_payload(a_dir, cp.url)
        pb = boot_payload(b_dir, cp.url)
        pb["driver_instance_id"] = other
        pb["session"]["id"] = "ses-other"
        a, b = Driver(a_dir, pa), Driver(b_dir, pb)
        try:
            sa = await turn(cp, INSTANCE, "run-a", "[[say:from a]]")
            sb = await turn(cp, other, "run-b", "[[say:from b]]")
            assert sa["status"] == "completed" and sb["status"] == "completed"
            texts = {
                i: [e["payload"]["text"] for e in cp.events(i) if e["kind"] == "message.completed"]
                for i in (INSTANCE, other)
            }
            assert texts == {INSTANCE: ["from a"], other: ["from b"]}
            assert cp.hello(INSTANCE)["epoch"] == 1 and cp.hello(other)["epoch"] == 1  # type: ignore[index]
            assert a.proc.poll() is None and b.proc.poll() is None
        finally:
            a.close()
            b.close()
