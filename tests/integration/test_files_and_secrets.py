"""Skills, attachments, artifacts and secret hygiene through the real driver process."""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path

from tests.integration.harness import INSTANCE, TOKEN, DriverProcess, boot_payload, control_plane


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def test_attachments_artifacts_skills_and_child_environment(tmp_path: Path, drivers: list[DriverProcess]) -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("SKILL.md", "# a skill")
    good = tmp_path / "good.zip"
    good.write_bytes(buf.getvalue())
    attachment = tmp_path / "notes.txt"
    attachment.write_bytes(b"attached!")
    async with control_plane(tmp_path) as cp:
        payload = boot_payload(tmp_path, cp.url)
        payload["execution"]["skills"] = [
            {
                "name": "good",
                "archive_url": good.as_uri(),
                "sha256": sha(good.read_bytes()),
                "mount_path": ".skills/good",
            },
            {"name": "bad", "archive_url": good.as_uri(), "sha256": "0" * 64, "mount_path": ".skills/bad"},
        ]
        d = DriverProcess(tmp_path, payload)
        drivers.append(d)
        diag = await cp.wait_for_event(
            INSTANCE,
            lambda e: e["kind"] == "diagnostic.reported" and e["payload"]["code"] == "skill.failed",
            timeout=20,
        )
        assert "bad" in diag["payload"]["message"]
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=20)
        cwd = tmp_path / "cwd"
        assert (cwd / ".skills" / "good" / "SKILL.md").read_text() == "# a skill"
        assert not (cwd / ".skills" / "bad").exists()

        # The attachment lands in inputs/, the prompt names it; a file written under outputs/ is reported.
        text = "[[echo]]"
        cid, _ = await cp.send_command(
            INSTANCE,
            "input.start",
            run_id="run-att",
            input={
                "text": text,
                "attachments": [
                    {"name": "notes.txt", "url": attachment.as_uri(), "sha256": sha(b"attached!"), "size": 9}
                ],
            },
        )
        st = await cp.wait_for_command_status(cid, timeout=30)
        assert st["status"] == "completed"
        assert (cwd / "inputs" / "notes.txt").read_bytes() == b"attached!"
        final = cp.events(INSTANCE, kinds="run.completed", run_id="run-att")[0]["payload"]["final_message_text"]
        assert "inputs/notes.txt" in final
        # The attachment itself reached the adapter too (not only its name in the text).
        assert f"[resource_link] {(cwd / 'inputs' / 'notes.txt').as_uri()}" in final

        cid2, _ = await cp.send_command(
            INSTANCE,
            "input.start",
            run_id="run-out",
            input={"text": "[[shell:mkdir -p outputs && printf report > outputs/r.txt && env]]"},
        )
        st2 = await cp.wait_for_command_status(cid2, timeout=30)
        assert st2["status"] == "completed"
        produced = cp.events(INSTANCE, kinds="artifact.produced", run_id="run-out")
        assert [e["payload"] for e in produced] == [{"path": "outputs/r.txt", "size": 6, "sha256": sha(b"report")}]
        # The provider's own children see the provider credential but never the control token.
        env_dump = cp.events(INSTANCE, kinds="run.completed", run_id="run-out")[0]["payload"]["final_message_text"]
        assert "FAKE_PROVIDER_KEY=provider-secret-777" in env_dump
        assert TOKEN not in env_dump
        assert "AGENT_DRIVER" not in env_dump

        # A bad attachment fails the run with a clear code, and nothing lingers.
        cid3, _ = await cp.send_command(
            INSTANCE,
            "input.start",
            run_id="run-bad",
            input={
                "text": "x",
                "attachments": [{"name": "n.txt", "url": attachment.as_uri(), "sha256": "0" * 64, "size": 9}],
            },
        )
        st3 = await cp.wait_for_command_status(cid3, timeout=30)
        assert st3["status"] == "failed" and st3["error"]["code"] == "input.attachment_invalid"
        assert not (cwd / "inputs" / "n.txt").exists()

        # An image for an agent that takes no images (the stub advertises none) is refused, not lost.
        image = tmp_path / "pic.png"
        image.write_bytes(b"\x89PNG\r\n\x1a\n not really")
        cid4, _ = await cp.send_command(
            INSTANCE,
            "input.start",
            run_id="run-img",
            input={
                "text": "[[say:never]]",
                "attachments": [
                    {"name": "pic.png", "url": image.as_uri(), "sha256": sha(image.read_bytes()), "size": 19}
                ],
            },
        )
        st4 = await cp.wait_for_command_status(cid4, timeout=30)
        assert st4["status"] == "failed" and st4["error"]["code"] == "command.invalid", st4
        assert "does not accept images" in st4["error"]["message"]

        # Nothing the driver stored or logged carries the token.
        everything = repr(cp.events(INSTANCE))
        assert TOKEN not in everything
        assert TOKEN not in d.stderr()
        for path in [*(tmp_path / "state").rglob("*"), *cwd.rglob("*")]:
            if path.is_file():
                assert TOKEN.encode() not in path.read_bytes(), path
