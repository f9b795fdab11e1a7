"""PROTOCOL §8.1 through the real driver process, the REAL runtimes and the reference control plane: the
native session goes out as checkpoints after every run (only new bytes of a file that grew), the control
plane reassembles them, and a brand-new sandbox (new state_dir, new cwd) booted with
`execution.native_checkpoint` resumes the session natively: its first model request carries a marker
of the earlier conversation, with no `runtime.session.reset`. Tampered and missing files fall back to
reset + replay and say why. No credential is in any checkpoint.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import INSTANCE, ROOT, control_plane
from tests.kernel import runtimes
from tests.kernel.runtimes import RUNTIMES, Fakes
from tests.kernel.support import Driver
from tests.kernel.test_continuity import turn

MARKER = "HERON-4417"
CLAUDE_ACP = ROOT / "node_modules" / "@agentclientprotocol" / "claude-agent-acp" / "dist" / "index.js"
# claude-agent-acp drives the Claude Code CLI: its session files are the CLI's (docs/protocol.md).
CHECKPOINTED = (*RUNTIMES, "acp:claude-agent-acp")
SECRETS = ("sk-ant-fake-0123456789", "sk-fake-openai-0123456789")


def sandbox(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def fake_of(fakes: Fakes, runtime: str) -> Any:
    return fakes.anthropic if "claude" in runtime else fakes.responses


def first_turn_request(fakes: Fakes, runtime: str, after: int) -> str:
    """The first agent-loop model request (one offering tools) after the first `after`: Claude Code also
    sends tool-less side requests (a session title) that quote only the new prompt."""
    asked = fake_of(fakes, runtime).requests[after:]
    return json.dumps(next((r for r in asked if r.get("tools")), asked[0]))


def boot_payload(runtime: str, tmp: Path, url: str, fakes: Fakes) -> dict[str, Any]:
    if runtime != "acp:claude-agent-acp":
        return runtimes.payload(runtime, tmp, url, fakes)
    payload = runtimes.payload("acp:stubborn", tmp, url, fakes)
    env = {
        "ANTHROPIC_BASE_URL": fakes.anthropic.base_url,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "CLAUDE_CONFIG_DIR": str(tmp / "state" / "claude"),
        "CLAUDE_CODE_MAX_RETRIES": "0",
        "IS_SANDBOX": "1",
    }
    payload["execution"] |= {
        "environment": {"ANTHROPIC_API_KEY": "sk-ant-fake-0123456789"},
        "acp": {"command": ["node", str(CLAUDE_ACP)], "env": env},
    }
    return payload


def kinds_of(cp: Any, kind: str) -> list[dict[str, Any]]:
    return [e for e in cp.events(INSTANCE) if e["kind"] == kind]


async def first_sandbox(cp: Any, runtime: str, tmp: Path, fakes: Fakes, runs: int = 2) -> list[dict[str, Any]]:
    """Sandbox A: `runs` runs (the first carries the marker); returns the stored checkpoints."""
    d = Driver(tmp, boot_payload(runtime, tmp, cp.url, fakes))
    try:
        for i in range(1, runs + 1):
            text = f"Please remember the word {MARKER}." if i == 1 else f"Turn {i}: say ok."
            status = await turn(cp, f"run-{i}", text)
            assert status["status"] == "completed", status
            await cp.wait_for_event(
                INSTANCE, lambda e, i=i: e["kind"] == "checkpoint.recorded" and e["payload"]["run_id"] == f"run-{i}"
            )
    finally:
        d.close()
    stored: list[dict[str, Any]] = cp.checkpoints(INSTANCE)
    return stored


def second_payload(
    runtime: str, tmp: Path, url: str, fakes: Fakes, checkpoint: dict[str, Any], replay: bool = True
) -> dict[str, Any]:
    payload = boot_payload(runtime, tmp, url, fakes)
    payload["execution"]["native_checkpoint"] = checkpoint
    if replay:
        # What a control plane replays when the native session cannot come back (PROTOCOL §8). Left
        # out where the marker must come from the restored session alone.
        text = f"Earlier I asked you to remember {MARKER}."
        payload["execution"]["recovery_messages"] = [{"role": "user", "text": text}]
    return payload


@pytest.mark.provider
@pytest.mark.parametrize("runtime", CHECKPOINTED)
async def test_a_new_sandbox_resumes_the_native_session_from_a_checkpoint(
    runtime: str, tmp_path: Path, fakes: Fakes
) -> None:
    async with control_plane(sandbox(tmp_path / "a")) as cp:
        stored = await first_sandbox(cp, runtime, tmp_path / "a", fakes)
        assert len(stored) == 2, stored
        chunks = kinds_of(cp, "checkpoint.file")
        # Incremental: the second checkpoint sends the session file from where the first ended.
        first_id, second_id = stored[0]["checkpoint_id"], stored[1]["checkpoint_id"]
        first = {c["payload"]["path"]: c["payload"] for c in chunks if c["payload"]["checkpoint_id"] == first_id}
        second = [c["payload"] for c in chunks if c["payload"]["checkpoint_id"] == second_id]
        assert second, "the second run's checkpoint sent nothing"
        for c in second:
            if c["path"] in first:
                assert c["offset"] >= first[c["path"]]["size"] > 0, (c["offset"], first[c["path"]]["size"])
        # No credential in any checkpoint.
        for c in chunks:
            data = base64.b64decode(c["payload"]["data_b64"])
            assert not any(s.encode() in data for s in SECRETS)
        files = [f["path"] for f in stored[-1]["files"]]
        assert all(p.endswith(".jsonl") for p in files), files
        checkpoint = cp.native_checkpoint(INSTANCE, tmp_path / "served")
        assert checkpoint is not None

    b = sandbox(tmp_path / "b")  # a brand-new sandbox: new state_dir, new cwd
    async with control_plane(b) as cp:
        d = Driver(b, second_payload(runtime, b, cp.url, fakes, checkpoint, replay=False))
        try:
            asked_before = len(fake_of(fakes, runtime).requests)
            status = await turn(cp, "run-3", "Which word did I ask you to remember?")
            assert status["status"] == "completed", status
            assert MARKER in first_turn_request(fakes, runtime, asked_before)
            # Natively: no reset, the restored ref is the current one, and the restore was reported.
            assert kinds_of(cp, "runtime.session.reset") == []
            refs = [e["payload"]["value"] for e in kinds_of(cp, "runtime.resume.updated")]
            assert refs and refs[-1] == checkpoint["native_ref"]
            restored = [e for e in kinds_of(cp, "diagnostic.reported") if e["payload"]["code"] == "checkpoint.restored"]
            assert restored and restored[0]["payload"]["details"]["bytes"] == sum(
                f["size"] for f in checkpoint["files"]
            )
            # The new sandbox checkpoints the same session on.
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "checkpoint.recorded")
            assert cp.checkpoints(INSTANCE)[-1]["native_ref"] == checkpoint["native_ref"]
        finally:
            d.close()


# Each runtime falls back once. The fault is found before any runtime's code runs (driver/checkpoints/
# restore.py; every kind, and that nothing is left behind, in tests/checkpoints/): both kinds reach a
# real runtime, and the Codex family gets both.
BAD_CHECKPOINTS = list(zip(RUNTIMES, ["tampered", "missing", "tampered"], strict=True))


@pytest.mark.provider
@pytest.mark.parametrize(("runtime", "fault"), BAD_CHECKPOINTS)
async def test_a_bad_checkpoint_falls_back_to_reset_and_replay(
    runtime: str, fault: str, tmp_path: Path, fakes: Fakes
) -> None:
    async with control_plane(sandbox(tmp_path / "a")) as cp:
        await first_sandbox(cp, runtime, tmp_path / "a", fakes, runs=1)
        checkpoint = cp.native_checkpoint(INSTANCE, tmp_path / "served")
        assert checkpoint is not None
    target = Path(checkpoint["files"][0]["url"].removeprefix("file://"))
    if fault == "tampered":
        data = bytearray(target.read_bytes())
        data[len(data) // 2] ^= 0x01
        target.write_bytes(bytes(data))
    else:
        target.unlink()

    b = sandbox(tmp_path / "b")
    async with control_plane(b) as cp:
        d = Driver(b, second_payload(runtime, b, cp.url, fakes, checkpoint))
        try:
            asked_before = len(fake_of(fakes, runtime).requests)
            status = await turn(cp, "run-2", "Which word did I ask you to remember?")
            assert status["status"] == "completed", status
            reset = kinds_of(cp, "runtime.session.reset")
            assert len(reset) == 1, reset
            payload = reset[0]["payload"]
            assert payload["previous"] == checkpoint["native_ref"]
            assert payload["current"] and payload["current"] != checkpoint["native_ref"]
            code = "checkpoint.hash_mismatch" if fault == "tampered" else "checkpoint.fetch_failed"
            assert payload["reason"].startswith(code), payload["reason"]
            # Replayed: the model still hears of the marker, from the recovery messages.
            assert MARKER in first_turn_request(fakes, runtime, asked_before)
            # Nothing of the bad checkpoint was left in the provider's home.
            home = b / "state"
            assert not [p for p in home.rglob(f"*{checkpoint['native_ref']}*.jsonl")]
        finally:
            d.close()


@pytest.mark.provider
async def test_session_stop_records_a_checkpoint_and_waits_for_its_receipt(tmp_path: Path, fakes: Fakes) -> None:
    runtime = "openai-app-server"
    async with control_plane(sandbox(tmp_path)) as cp:
        d = Driver(tmp_path, boot_payload(runtime, tmp_path, cp.url, fakes))
        try:
            assert (await turn(cp, "run-1", f"Remember {MARKER}."))["status"] == "completed"
            after = max(e["seq"] for e in cp.events(INSTANCE))
            cid, _ = await cp.send_command(INSTANCE, "session.stop", reason="test")
            assert await d.wait(timeout=60) == 0
            # Stored (so receipted) before the driver exited: a manifest after the stop, of the last run.
            late = [e for e in kinds_of(cp, "checkpoint.recorded") if e["seq"] > after]
            assert len(late) == 1 and late[0]["payload"]["run_id"] == "run-1"
            assert cp.checkpoints(INSTANCE)[-1]["checkpoint_id"] == late[0]["payload"]["checkpoint_id"]
            assert cp.command(cid)["status"] == "completed"  # type: ignore[index]
        finally:
            d.close()


@pytest.mark.provider
async def test_a_restart_on_the_same_state_dir_keeps_the_restored_session(tmp_path: Path, fakes: Fakes) -> None:
    runtime = "openai-app-server"
    async with control_plane(sandbox(tmp_path / "a")) as cp:
        await first_sandbox(cp, runtime, tmp_path / "a", fakes, runs=1)
        checkpoint = cp.native_checkpoint(INSTANCE, tmp_path / "served")
        assert checkpoint is not None
    b = sandbox(tmp_path / "b")
    async with control_plane(b) as cp:
        payload = second_payload(runtime, b, cp.url, fakes, checkpoint, replay=False)
        d = Driver(b, payload)
        try:
            assert (await turn(cp, "run-2", "Say ok."))["status"] == "completed"
        finally:
            d.close()
        # The served files are gone now: a restart that fetched them again would fall back.
        for f in checkpoint["files"]:
            Path(f["url"].removeprefix("file://")).unlink()
        d = Driver(b, payload, name="driver2")
        try:
            asked_before = len(fake_of(fakes, runtime).requests)
            assert (await turn(cp, "run-3", "Which word?"))["status"] == "completed"
            assert MARKER in first_turn_request(fakes, runtime, asked_before)
            assert kinds_of(cp, "runtime.session.reset") == []
            restored = [e for e in kinds_of(cp, "diagnostic.reported") if e["payload"]["code"] == "checkpoint.restored"]
            assert len(restored) == 1  # once per state_dir
        finally:
            d.close()


async def test_an_agent_of_unknown_layout_falls_back_and_takes_no_checkpoint(tmp_path: Path) -> None:
    """Our stubborn ACP agent keeps no session files the driver knows: a checkpoint given to it falls back
    (`checkpoint.unsupported`), and its runs record none."""
    from tests.integration.harness import boot_payload as stubborn_payload

    async with control_plane(sandbox(tmp_path)) as cp:
        payload = stubborn_payload(tmp_path, cp.url)
        digest = "0" * 64
        payload["execution"]["native_checkpoint"] = {
            "runtime": "acp",
            "native_ref": "ses-old",
            "files": [{"path": "x.jsonl", "url": (tmp_path / "nope").as_uri(), "size": 1, "sha256": digest}],
        }
        d = Driver(tmp_path, payload)
        try:
            assert (await turn(cp, "run-1", "[[say:hi]] hello"))["status"] == "completed"
            reset = await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "runtime.session.reset")
            assert reset["payload"]["previous"] == "ses-old"
            assert reset["payload"]["reason"].startswith("checkpoint.unsupported")
            assert kinds_of(cp, "checkpoint.recorded") == [] and kinds_of(cp, "checkpoint.file") == []
        finally:
            d.close()


@pytest.mark.provider
async def test_a_payload_minted_with_resume_from_restores_the_session(tmp_path: Path, fakes: Fakes) -> None:
    """The whole reference path: the session's checkpoints stored by one control plane, a payload minted by
    `agent-driver controlplane boot --resume-from` from its HTTP API, a driver in a new sandbox (talking to
    another control plane) resuming natively from it."""
    import asyncio

    from agent_lab.controlplane.boot import main as boot_main

    from tests.integration.harness import TOKEN

    runtime = "openai-app-server"
    b = sandbox(tmp_path / "b")
    async with control_plane(sandbox(tmp_path / "a")) as cp_a, control_plane(b) as cp_b:
        await first_sandbox(cp_a, runtime, tmp_path / "a", fakes, runs=1)
        token_file = tmp_path / "cp.token"
        token_file.write_text(TOKEN)
        out = tmp_path / "b.boot.json"
        argv = ["--runtime", runtime, "--instance", INSTANCE, "--out", str(out), "--url", str(cp_a.http_url),
                "--cp-url", cp_b.url, "--token-file", str(token_file), "--cwd", str(b / "cwd"),
                "--state-dir", str(b / "state"), "--model", "gpt-5.5", "--env", f"OPENAI_API_KEY={SECRETS[1]}",
                "--provider-option", f"base_url={fakes.responses.base_url}",
                "--provider-option", "env_key=OPENAI_API_KEY", "--resume-from", INSTANCE]  # fmt: skip
        assert await asyncio.to_thread(boot_main, argv) == 0
        payload = json.loads(out.read_text())
        assert payload["execution"]["native_checkpoint"]["files"][0]["url"].startswith("file:")
        (b / "cwd").mkdir(exist_ok=True)
        d = Driver(b, payload)
        try:
            asked_before = len(fake_of(fakes, runtime).requests)
            assert (await turn(cp_b, "run-2", "Which word did I ask you to remember?"))["status"] == "completed"
            assert MARKER in first_turn_request(fakes, runtime, asked_before)
            assert kinds_of(cp_b, "runtime.session.reset") == []
        finally:
            d.close()


@pytest.mark.provider
async def test_a_refused_checkpoint_makes_the_next_one_send_whole_files(tmp_path: Path, fakes: Fakes) -> None:
    """A control plane that lost the bytes a chunk continues (here: its working copy deleted) refuses the
    chunk (`checkpoint.incomplete`, final); the driver reports it and its next checkpoint starts over."""
    import sqlite3

    runtime = "openai-app-server"
    async with control_plane(sandbox(tmp_path)) as cp:
        d = Driver(tmp_path, boot_payload(runtime, tmp_path, cp.url, fakes))
        try:
            assert (await turn(cp, "run-1", f"Remember {MARKER}."))["status"] == "completed"
            # The command's status can arrive (a command.update frame) before the batch that stores run-1's
            # checkpoint: only once it is stored does deleting the CP's copy make run-2's refused.
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "checkpoint.recorded"
                                    and e["payload"]["run_id"] == "run-1")  # fmt: skip
            with sqlite3.connect(tmp_path / "cp.sqlite3") as db:
                db.execute("DELETE FROM checkpoint_files")
            assert (await turn(cp, "run-2", "Say ok."))["status"] == "completed"
            await cp.wait_for_event(
                INSTANCE,
                lambda e: (
                    e["kind"] == "diagnostic.reported"
                    and e["payload"]["code"] == "event.rejected"
                    and e["payload"]["details"]["kind"].startswith("checkpoint.")
                ),
            )
            assert [c["run_id"] for c in cp.checkpoints(INSTANCE)] == ["run-1"]  # run-2's was refused
            assert (await turn(cp, "run-3", "Say ok again."))["status"] == "completed"
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "checkpoint.recorded" and e["run_id"] is None
                                    and e["payload"]["run_id"] == "run-3")  # fmt: skip
            latest = cp.checkpoints(INSTANCE)[-1]
            assert latest["run_id"] == "run-3"
            third = [e["payload"] for e in kinds_of(cp, "checkpoint.file")
                     if e["payload"]["checkpoint_id"] == latest["checkpoint_id"]]  # fmt: skip
            assert third and third[0]["offset"] == 0  # the whole file again
        finally:
            d.close()


def peak_rss_kib(pid: int) -> int:
    """The process's peak resident set (VmHWM), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


@pytest.mark.provider
async def test_sparse_giants_in_the_session_folder_are_refused_before_a_byte_is_read(
    tmp_path: Path, fakes: Fakes
) -> None:
    """PROTOCOL §9: the agent's shell makes six sparse 64 MiB files (no disk) in its own native session's
    folder; the next checkpoint measures them first and refuses (`checkpoint.too_large`) without reading
    them: the driver's peak RSS grows by far less than one of them (384 MiB before the fix)."""
    runtime = "claude-agent-sdk"
    home = tmp_path / "state" / "providers" / runtime / "claude-config"
    script = (
        f'for f in {home}/projects/*/*.jsonl; do s="${{f%.jsonl}}/tool-results"; mkdir -p "$s"; '
        f'for i in 1 2 3 4 5 6; do truncate -s 64M "$s/giant$i.txt"; done; done; '
        f"ls {home}/projects/*/*/tool-results > {tmp_path / 'cwd' / 'made.txt'}"
    )
    async with control_plane(sandbox(tmp_path)) as cp:
        payload = boot_payload(runtime, tmp_path, cp.url, fakes)
        payload["execution"]["permission_policy"] = "full_access"
        d = Driver(tmp_path, payload)
        try:
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=90)
            before = peak_rss_kib(d.pid)
            status = await turn(cp, "run-1", f"[[shell:{script}]]", timeout=90)
            assert status["status"] == "completed", status
            made = (tmp_path / "cwd" / "made.txt").read_text().split()
            assert len(made) == 6, made  # the tool did make them, in the session's folder
            diag = await cp.wait_for_event(
                INSTANCE,
                lambda e: e["kind"] == "diagnostic.reported" and e["payload"]["code"].startswith("checkpoint."),
                timeout=60,
            )
            assert diag["payload"]["code"] == "checkpoint.too_large", diag
            assert diag["payload"]["details"]["bytes"] >= 6 * 64 * 1024 * 1024
            assert kinds_of(cp, "checkpoint.recorded") == []
            grown_mib = (peak_rss_kib(d.pid) - before) / 1024
            assert grown_mib < 32, f"the driver's peak RSS grew {grown_mib:.0f} MiB"
            # The driver goes on: the next run completes.
            assert (await turn(cp, "run-2", "say ok"))["status"] == "completed"
        finally:
            d.close()
