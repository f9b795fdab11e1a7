"""Hostile file trees the agent controls (issue 19 items 2 and 3, PROTOCOL §6.5, §9), through the REAL
driver process and a real ACP agent: names that are not UTF-8 under `outputs/` and under `cwd` (on
`turn.cancel`), a symlinked `outputs/`, a huge `outputs/`. Each is reported, and the driver carries on:
the next run completes on the same process."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.faults.test_faults import booted, status
from tests.integration.harness import INSTANCE, DriverProcess, boot_payload, control_plane

pytestmark = pytest.mark.faults

BAD = b"bad\xffname\xfe.txt"  # not UTF-8: os.fsdecode gives a str with lone surrogates


def write_bytes_name(folder: Path, name: bytes, data: bytes) -> None:
    fd = os.open(os.fsencode(folder) + b"/" + name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


async def run_ok(cp: Any, run_id: str) -> None:
    """The driver carries on: a new run on the same process completes."""
    cid, _ = await cp.send_command(INSTANCE, "input.start", run_id=run_id, input={"text": "[[say:still here]]"})
    assert (await status(cp, cid, timeout=30))["status"] == "completed"


FAST_CANCEL = {"AGENT_DRIVER_CANCEL_GRACE_MS": "300", "AGENT_DRIVER_TERM_GRACE_MS": "300"}


async def shell_run(cp: Any, run_id: str, script: str) -> dict[str, Any]:
    cid, _ = await cp.send_command(INSTANCE, "input.start", run_id=run_id, input={"text": f"[[shell:{script}]]"})
    return await status(cp, cid, timeout=60)


async def test_non_utf8_names_are_escaped_with_path_b64(tmp_path: Path) -> None:
    async with control_plane(tmp_path) as cp:
        d = DriverProcess(tmp_path, boot_payload(tmp_path, cp.url), extra_env=FAST_CANCEL)
        try:
            await booted(cp)
            cwd = tmp_path / "cwd"
            # The agent's tool writes a file with a bad name in outputs/ and another in cwd, then waits.
            bad = "$(printf 'bad\\377name\\376.txt')"
            script = f'mkdir -p outputs; printf artifact > "outputs/{bad}"; printf effect > "{bad}"; '
            script += "echo x > plain.txt; sleep 30"
            text = f"[[shell:{script}]]"
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": text})
            with anyio.fail_after(30):
                while not (cwd / "plain.txt").exists():  # noqa: ASYNC110 (a file the agent writes)
                    await anyio.sleep(0.05)
            cancel, _ = await cp.send_command(INSTANCE, "turn.cancel", run_id="run-1", reason="user")
            assert (await status(cp, cancel, timeout=30))["status"] == "completed"
            assert (await status(cp, cid, timeout=30))["status"] == "cancelled"

            escaped = BAD.decode("utf-8", "backslashreplace")
            assert escaped == "bad\\xffname\\xfe.txt"
            b64 = base64.b64encode(BAD).decode()
            [art] = cp.events(INSTANCE, kinds="artifact.produced", run_id="run-1")
            assert art["payload"]["path"] == f"outputs/{escaped}"
            assert base64.b64decode(art["payload"]["path_b64"]) == b"outputs/" + BAD
            assert art["payload"]["size"] == len(b"artifact")
            [cancelled] = cp.events(INSTANCE, kinds="run.cancelled", run_id="run-1")
            changed = {c["path"]: c for c in cancelled["payload"]["side_effects"]["files_changed"]}
            assert changed[escaped] == {"path": escaped, "change": "created", "path_b64": b64}
            assert changed["plain.txt"] == {"path": "plain.txt", "change": "created"}  # no path_b64
            await run_ok(cp, "run-2")
            assert d.proc.poll() is None
            assert "Traceback" not in d.stderr()
        finally:
            d.close()


async def test_symlinked_outputs_is_refused_and_huge_outputs_is_bounded(tmp_path: Path) -> None:
    # Outside cwd but visible to the agent's tools: the boot file's folder (tmp_path) is hidden from the
    # provider tree (PROTOCOL §9), state_dir is bound back.
    outside = tmp_path / "state" / "outside"
    outside.mkdir(parents=True)
    (outside / "secret.txt").write_text("not an artifact of this run")
    async with control_plane(tmp_path) as cp:
        d = DriverProcess(tmp_path, boot_payload(tmp_path, cp.url))
        try:
            await booted(cp)
            cwd = tmp_path / "cwd"
            (cwd / "outputs").symlink_to(outside, target_is_directory=True)
            assert (await shell_run(cp, "run-1", "echo new > outputs/new.txt"))["status"] == "completed"
            assert (outside / "new.txt").exists()
            assert cp.events(INSTANCE, kinds="artifact.produced") == []
            diag = await cp.wait_for_event(
                INSTANCE, lambda e: e["kind"] == "diagnostic.reported" and e["payload"]["code"] == "artifacts.refused"
            )
            assert "symbolic link" in diag["payload"]["message"]

            # A huge outputs/ (more files than the bound): the first ones are reported, then a diagnostic.
            # A symlink inside is never followed.
            (cwd / "outputs").unlink()
            (cwd / "outputs").mkdir()
            many = 1_000 + 25  # the count bound is 1,000 (driver/ports/outputs.py)
            script = "ln -s ../../state/outside/secret.txt outputs/link; "
            script += f"for i in $(seq 1 {many}); do echo $i > outputs/f$(printf %05d $i).txt; done"
            assert (await shell_run(cp, "run-2", script))["status"] == "completed"
            arts = cp.events(INSTANCE, kinds="artifact.produced", run_id="run-2")
            assert len(arts) == 1_000
            assert [a["payload"]["path"] for a in arts] == [f"outputs/f{i:05d}.txt" for i in range(1, 1_001)]
            cut = await cp.wait_for_event(
                INSTANCE,
                lambda e: e["kind"] == "diagnostic.reported" and e["payload"]["code"] == "artifacts.truncated",
            )
            assert cut["payload"]["details"]["reported"] == 1_000
            assert cut["payload"]["details"]["left"] == 25
            await run_ok(cp, "run-3")
            assert d.proc.poll() is None
        finally:
            d.close()


async def test_a_fifo_in_place_of_a_file_never_holds_the_driver(tmp_path: Path) -> None:
    """ACP `fs/*` on a FIFO the agent made: refused at once, not a worker thread blocked forever."""
    async with control_plane(tmp_path) as cp:
        d = DriverProcess(tmp_path, boot_payload(tmp_path, cp.url))
        try:
            await booted(cp)
            assert (await shell_run(cp, "run-1", "mkfifo pipe.txt"))["status"] == "completed"
            # Read: refused as no regular file. Write: refused (no reader: ENXIO), never blocked.
            for i, (text, error) in enumerate([("[[read:pipe.txt]]", "regular file"), ("[[write:pipe.txt:x]]", "")]):
                cid, _ = await cp.send_command(INSTANCE, "input.start", run_id=f"fifo-{i}", input={"text": text})
                assert (await status(cp, cid, timeout=20))["status"] == "completed"
                [done] = cp.events(INSTANCE, kinds="run.completed", run_id=f"fifo-{i}")
                reply = done["payload"]["final_message_text"]
                assert reply.startswith(("read error:", "write error:")) and error in reply, reply
            await run_ok(cp, "run-2")
            assert d.proc.poll() is None
        finally:
            d.close()
