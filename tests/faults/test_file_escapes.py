"""ACP `fs/*` and attachments that try to leave the allowed roots (issue 11, fuzz 4), through the
REAL driver process and a real ACP agent: `..`, absolute paths, a symlink created mid-session to
escape, very long names and NUL bytes are refused, and nothing is written outside the roots."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.faults.test_faults import status
from tests.integration.harness import INSTANCE, DriverProcess, boot_payload, control_plane

pytestmark = pytest.mark.faults


@pytest.fixture
def started() -> Iterator[list[DriverProcess]]:
    ds: list[DriverProcess] = []
    yield ds
    for d in ds:
        d.close()


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


async def final_text(cp: Any, run_id: str, text: str, attachments: list[dict[str, Any]] | None = None) -> str:
    body: dict[str, Any] = {"text": text}
    if attachments:
        body["attachments"] = attachments
    cid, _ = await cp.send_command(INSTANCE, "input.start", run_id=run_id, input=body)
    st = await status(cp, cid, timeout=60)
    if st["status"] != "completed":
        return f"{st['status']}: {st.get('error')}"
    [done] = cp.events(INSTANCE, kinds="run.completed", run_id=run_id)
    return str(done["payload"]["final_message_text"])


async def test_fs_and_attachment_escapes_are_refused(tmp_path: Path, started: list[DriverProcess]) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    async with control_plane(tmp_path) as cp:
        d = DriverProcess(tmp_path, boot_payload(tmp_path, cp.url))
        started.append(d)
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=30)
        cwd = tmp_path / "cwd"
        (cwd / "sub").mkdir()
        before = tree(tmp_path)
        escapes = [
            "../outside/a.txt",
            str(outside / "b.txt"),
            "sub/../../outside/c.txt",
            "x" * 300 + ".txt",
            "sub/" + "/".join(["d"] * 2100),
            "nul\u0000byte.txt",
        ]
        for i, path in enumerate(escapes):
            reply = await final_text(cp, f"w-{i}", f"[[write:{path}:escaped]]")
            assert reply.startswith("write error:"), (path[:40], reply)
            reply = await final_text(cp, f"r-{i}", f"[[read:{path}]]")
            assert reply.startswith("read error:"), (path[:40], reply)
        # A directory inside the roots becomes a symlink out of them, mid-session.
        assert (await final_text(cp, "w-ok", "[[write:sub/ok.txt:inside]]")) == "write ok"
        os.rename(cwd / "sub", cwd / "sub.old")
        (cwd / "sub").symlink_to(outside, target_is_directory=True)
        assert (await final_text(cp, "w-link", "[[write:sub/ok.txt:escaped]]")).startswith("write error:")
        (outside / "secret.txt").write_text("outside secret")
        reply = await final_text(cp, "r-link", "[[read:sub/secret.txt]]")
        assert reply.startswith("read error:") and "outside secret" not in reply
        # An attachment with a path in its name, and one into an `inputs` directory swapped for a link.
        src = tmp_path / "src.bin"
        src.write_bytes(b"payload")
        good = {"url": src.as_uri(), "sha256": hashlib.sha256(b"payload").hexdigest(), "size": 7}
        for name in ["../outside/att.bin", "/abs.bin", "a/b.bin", "nul\u0000.bin", "y" * 300]:
            reply = await final_text(cp, f"att-{len(name)}-{name[:3]}", "[[say:x]]", [{"name": name, **good}])
            assert reply.startswith("failed"), (name[:40], reply)
        (cwd / "inputs").symlink_to(outside, target_is_directory=True)
        reply = await final_text(cp, "att-link", "[[say:x]]", [{"name": "att.bin", **good}])
        assert reply.startswith("failed"), reply
        assert sorted(os.listdir(outside)) == ["secret.txt"]  # nothing was written outside the roots
        assert tree(tmp_path) - before <= {
            "cwd/sub.old",
            "cwd/sub.old/ok.txt",
            "cwd/sub",
            "cwd/inputs",
            "outside/secret.txt",
            "src.bin",
        } | {p for p in tree(tmp_path) if p.startswith(("state", "cp", "driver"))}
        assert d.proc.poll() is None
