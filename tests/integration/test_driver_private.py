"""PROTOCOL §9 through the real driver process: with `state_dir` inside `cwd`, an ACP agent's
`fs/read_text_file` and `fs/write_text_file` on the journal (by path, by symlink, by hard link) are
refused, and a skill mounted over `state_dir` is not installed; the driver goes on."""

from __future__ import annotations

import hashlib
import io
import os
import zipfile
from pathlib import Path

from tests.integration.harness import INSTANCE, DriverProcess, boot_payload, control_plane

TERMINALS = ("run.completed", "run.failed", "run.cancelled")


async def test_acp_fs_and_skills_never_reach_the_driver_state(tmp_path: Path, drivers: list[DriverProcess]) -> None:
    cwd = tmp_path / "cwd"
    state = cwd / ".state"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("SKILL.md", "# over the journal")
    archive = tmp_path / "skill.zip"
    archive.write_bytes(buf.getvalue())
    async with control_plane(tmp_path) as cp:
        payload = boot_payload(tmp_path, cp.url, state_dir=str(state))
        payload["execution"]["permission_policy"] = "full_access"
        payload["execution"]["skills"] = [
            {
                "name": "wipe",
                "archive_url": archive.as_uri(),
                "sha256": hashlib.sha256(archive.read_bytes()).hexdigest(),
                "mount_path": ".state",
            }
        ]
        d = DriverProcess(tmp_path, payload)
        drivers.append(d)
        diag = await cp.wait_for_event(
            INSTANCE,
            lambda e: e["kind"] == "diagnostic.reported" and e["payload"]["code"] == "skill.failed",
            timeout=20,
        )
        assert "driver's own state" in diag["payload"]["message"]
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=20)
        journal = state / "driver" / "journal.sqlite3"
        before = journal.stat().st_size
        assert before > 0
        (cwd / "j").symlink_to(journal)
        os.link(journal, cwd / "h")  # what an agent could do only where it sees the journal
        attempts = {
            "read": f"[[read:{journal}]]",
            "write": f"[[write:{journal}:forged]]",
            "symlink": "[[read:j]]",
            "hardlink-read": "[[read:h]]",
            "hardlink-write": "[[write:h:forged]]",
            "lock": f"[[write:{state / 'driver.lock'}:1]]",
        }
        for n, (name, text) in enumerate(attempts.items()):
            await cp.send_command(INSTANCE, "input.start", run_id=f"run-{n}", input={"text": text})
            term = await cp.wait_for_event(
                INSTANCE, lambda e, n=n: e["run_id"] == f"run-{n}" and e["kind"] in TERMINALS, timeout=30
            )
            reply = str(term["payload"].get("final_message_text"))
            assert "error" in reply and "driver's own state" in reply, (name, reply)
        assert b"forged" not in journal.read_bytes()
        assert journal.stat().st_size >= before  # still the driver's journal, still growing
        assert (state / "driver.lock").read_text().split()[0] == str(d.pid)  # then its start time and MAC
        await cp.send_command(INSTANCE, "input.start", run_id="run-ok", input={"text": "[[write:ok.txt:fine]]"})
        await cp.wait_for_event(
            INSTANCE, lambda e: e["run_id"] == "run-ok" and e["kind"] == "run.completed", timeout=30
        )
        assert (cwd / "ok.txt").read_text() == "fine"
