"""The per-runtime allowlist (driver/checkpoints/layout.py) and the restore (restore.py), without a
provider: the Claude folder matches the CLI's function (values computed by node running the CLI's
code), only allowlisted paths are read or written, links are never followed, and a failed restore
leaves nothing behind."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import msgspec
import pytest

from driver.checkpoints import layout
from driver.checkpoints.recorder import CheckpointError, read_file
from driver.checkpoints.restore import RestoreFailed, restore
from driver.protocol.boot import ExecutionConfig, NativeCheckpoint

REF = "0bd3d8d6-4d2b-48a4-8556-7ad4e43e3852"
ROLLOUT = f"sessions/2026/12/01/rollout-2026-12-01T10-00-00-{REF}.jsonl"


def test_the_claude_folder_is_the_clis() -> None:
    long = "/workspace/" + "very-long-folder-name-" * 12 + "/é/🙂/x"
    assert layout.claude_project_folder("/tmp/ckpt/claude/cwd") == "-tmp-ckpt-claude-cwd"
    # From node, with the CLI's own functions: a non-BMP character is two UTF-16 units, two dashes.
    assert layout.claude_project_folder("/tmp/a b/ü🙂") == "-tmp-a-b----"
    assert layout.claude_project_folder(long) == "-workspace" + "-very-long-folder-name" * 8 + "-very-long-fol-ebl77m"


@pytest.mark.parametrize(
    ("family", "rel", "ok"),
    [
        ("claude", f"projects/-w/{REF}.jsonl", True),
        ("claude", f"projects/-w/{REF}/subagents/agent-1.jsonl", True),
        ("claude", "projects/-w/other.jsonl", False),
        ("claude", f"projects/../{REF}.jsonl", False),
        ("claude", ".claude.json", False),
        ("claude", f"sessions/{REF}.key", False),
        ("claude", f"/projects/-w/{REF}.jsonl", False),
        ("codex", ROLLOUT, True),
        ("codex", "config.toml", False),
        ("codex", "auth.json", False),
        ("codex", "sessions/2026/12/01/rollout-x-other.jsonl", False),
        ("codex", f"sessions/2026/12/../rollout-x-{REF}.jsonl", False),
        ("codex", f"sessions/2026//01/rollout-x-{REF}.jsonl", False),
    ],
)
def test_the_allowlist(family: layout.Family, rel: str, ok: bool) -> None:
    assert layout.allowed(family, rel, REF) is ok
    assert not layout.allowed(family, rel, "../x")  # a ref that is not an id names nothing


def test_homes_per_runtime(tmp_path: Path) -> None:
    def execution(**kw: object) -> ExecutionConfig:
        return msgspec.convert({"revision": "r", **kw}, ExecutionConfig)

    assert layout.layout_for(execution(runtime="claude-agent-sdk"), tmp_path) == layout.Layout(
        "claude", tmp_path / "claude-config"
    )
    assert layout.layout_for(execution(runtime="openai-app-server"), tmp_path) == layout.Layout(
        "codex", tmp_path / "codex-home"
    )
    acp = execution(runtime="acp", acp={"command": ["/opt/bin/codex-acp"], "env": {"CODEX_HOME": "/h"}})
    assert layout.layout_for(acp, tmp_path) == layout.Layout("codex", Path("/h"))
    node = execution(runtime="acp", acp={"command": ["node", "/x/node_modules/claude-agent-acp/dist/index.js"]})
    assert layout.layout_for(node, tmp_path) == layout.Layout("claude", tmp_path / "home" / ".claude")
    assert layout.layout_for(execution(runtime="acp", acp={"command": ["my-agent"]}), tmp_path) is None


def test_session_files_are_this_sessions_and_never_a_link(tmp_path: Path) -> None:
    home = tmp_path / "claude-config"
    folder = home / "projects" / "-w"
    (folder / REF / "subagents").mkdir(parents=True)
    (folder / f"{REF}.jsonl").write_text("{}\n")
    (folder / REF / "subagents" / "agent-1.jsonl").write_text("{}\n")
    (folder / "other-session.jsonl").write_text("{}\n")
    secret = tmp_path / "credentials.json"
    secret.write_text("secret")
    (folder / REF / "planted.jsonl").symlink_to(secret)
    (home / "sessions").mkdir()
    (home / "sessions" / "2.key").write_text("peer token")
    found = layout.session_files(layout.Layout("claude", home), REF)
    assert found == [f"projects/-w/{REF}.jsonl", f"projects/-w/{REF}/subagents/agent-1.jsonl"]
    # The session file itself swapped for a link: not listed, and not readable through it either.
    (folder / f"{REF}.jsonl").unlink()
    (folder / f"{REF}.jsonl").symlink_to(secret)
    assert layout.session_files(layout.Layout("claude", home), REF) == [f"projects/-w/{REF}/subagents/agent-1.jsonl"]
    with pytest.raises(CheckpointError):
        read_file(home, f"projects/-w/{REF}.jsonl")


def _checkpoint(tmp_path: Path, files: dict[str, bytes], runtime: str = "openai-app-server") -> NativeCheckpoint:
    served = tmp_path / "served"
    served.mkdir(exist_ok=True)
    entries = []
    for i, (rel, data) in enumerate(files.items()):
        (served / str(i)).write_bytes(data)
        digest = hashlib.sha256(data).hexdigest()
        entries.append({"path": rel, "url": (served / str(i)).as_uri(), "size": len(data), "sha256": digest})
    return msgspec.convert({"runtime": runtime, "native_ref": REF, "files": entries}, NativeCheckpoint)


async def test_a_restore_places_claude_files_under_the_new_cwds_folder(tmp_path: Path) -> None:
    home = tmp_path / "home"
    data = b'{"type":"user"}\n'
    ckpt = _checkpoint(tmp_path, {f"projects/-old-cwd/{REF}.jsonl": data}, "claude-agent-sdk")
    done = await restore(ckpt, "claude-agent-sdk", layout.Layout("claude", home), "/new/cwd")
    assert (home / "projects" / "-new-cwd" / f"{REF}.jsonl").read_bytes() == data
    assert (done.files, done.bytes) == (1, len(data))


@pytest.mark.parametrize("fault", ["tampered", "missing", "path", "runtime", "size"])
async def test_a_bad_checkpoint_is_refused_and_leaves_nothing(tmp_path: Path, fault: str) -> None:
    home = tmp_path / "codex-home"
    first, second = ROLLOUT, ROLLOUT.replace("/01/", "/02/")
    ckpt = _checkpoint(tmp_path, {first: b"a" * 100, second: b"b" * 100})
    runtime = "openai-app-server"
    if fault == "tampered":
        (tmp_path / "served" / "1").write_bytes(b"c" * 100)
    elif fault == "missing":
        os.unlink(tmp_path / "served" / "1")
    elif fault == "path":
        ckpt = msgspec.structs.replace(
            ckpt, files=[ckpt.files[0], msgspec.structs.replace(ckpt.files[1], path="config.toml")]
        )
    elif fault == "runtime":
        runtime = "claude-agent-sdk"
    else:
        (tmp_path / "served" / "1").write_bytes(b"b" * 101)
    with pytest.raises(RestoreFailed) as failed:
        await restore(ckpt, runtime, layout.Layout("codex", home), "/cwd")
    code = {
        "tampered": "checkpoint.hash_mismatch",
        "missing": "checkpoint.fetch_failed",
        "path": "checkpoint.path_refused",
        "runtime": "checkpoint.runtime_mismatch",
        "size": "checkpoint.fetch_failed",
    }[fault]
    assert str(failed.value).startswith(code), failed.value
    assert not [p for p in home.rglob("*") if p.is_file()]  # all or nothing
