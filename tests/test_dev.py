"""`agent-driver dev`: the terminal view (no I/O) and the whole thing as a user runs it.

The end-to-end tests start `agent-driver dev` as a subprocess with no API key in its environment, so
it runs the REAL driver process and the REAL Claude Code CLI against the offline fake model endpoint.
They read its stdout as it streams and wait for text with timeouts, never for fixed times.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from agent_lab.dev import (
    AGENT_PREFIX,
    THINKING_PREFIX,
    DevPaths,
    ProviderSetup,
    Status,
    Transcript,
    boot_payload,
    choose_option,
    driver_environment,
    write_boot_file,
)

from driver.protocol.boot import BOOT_DECODER

ROOT = Path(__file__).resolve().parents[1]
DEV = [sys.executable, "-m", "driver.cli", "dev"]


def ev(kind: str, run_id: str | None = "run-1", **payload: Any) -> dict[str, Any]:
    return {"type": "event", "kind": kind, "run_id": run_id, "payload": payload}


# ---- the terminal view -------------------------------------------------------------------------


def test_deltas_stream_and_the_completed_text_fills_what_they_missed() -> None:
    t = Transcript()
    out = t.event(ev("run.started", run_id="run-1"))
    out += t.event(ev("message.started", message_id="m1", role="assistant"))
    out += t.event(ev("message.delta", message_id="m1", text="Hel"))
    assert out == AGENT_PREFIX + "Hel"
    # A delta was lost on the way ("lo, "): the deltas disagree with the completed text, so it is shown whole.
    out += t.event(ev("message.delta", message_id="m1", text="wor"))
    out += t.event(ev("message.completed", message_id="m1", role="assistant", text="Hello, world"))
    assert out == AGENT_PREFIX + "Helwor\n" + AGENT_PREFIX + "Hello, world\n"
    # Late deltas of a completed message are ignored, and run.completed does not repeat the text.
    assert t.event(ev("message.delta", message_id="m1", text="ld")) == ""
    assert t.event(ev("run.completed", final_message_text="Hello, world")) == ""


def test_completed_text_arbitrates_when_every_delta_arrived_or_none_did() -> None:
    t = Transcript()
    out = t.event(ev("message.delta", message_id="m1", text="Hello, "))
    out += t.event(ev("message.delta", message_id="m1", text="world"))
    out += t.event(ev("message.completed", message_id="m1", role="assistant", text="Hello, world"))
    assert out == AGENT_PREFIX + "Hello, world\n"
    # Only the tail was lost: the completed text adds just that.
    tail = t.event(ev("message.delta", message_id="m2", text="Sec"))
    tail += t.event(ev("message.completed", message_id="m2", role="assistant", text="Second"))
    assert tail == AGENT_PREFIX + "Second\n"
    only_completed = t.event(ev("message.completed", message_id="m3", role="assistant", text="Third"))
    assert only_completed == AGENT_PREFIX + "Third\n"


def test_notes_break_an_open_message_line_and_it_resumes_with_its_prefix() -> None:
    t = Transcript()
    out = t.event(ev("message.delta", message_id="m1", text="Let me "))
    out += t.event(ev("tool.started", tool_call_id="t1", name="Bash", title="touch x", input={"command": "touch x"}))
    out += t.event(ev("message.delta", message_id="m1", text="check."))
    out += t.event(ev("tool.completed", tool_call_id="t1", status="completed", output="", exit_code=0))
    out += t.event(ev("tool.completed", tool_call_id="t1", status="declined", output=None, exit_code=None))
    out += t.event(ev("message.completed", message_id="m1", role="assistant", text="Let me check."))
    assert out.splitlines() == [
        AGENT_PREFIX + "Let me ",
        "[tool] Bash: touch x",
        AGENT_PREFIX + "check.",
        "[tool] Bash declined",
    ]
    # A title that names the tool already is not prefixed twice.
    titled = t.event(ev("tool.started", tool_call_id="t2", name="Bash", title="Bash: Run ls", input={}))
    assert titled == "[tool] Bash: Run ls\n"


def test_user_messages_are_not_echoed_and_a_run_without_messages_shows_its_final_text() -> None:
    t = Transcript()
    assert t.event(ev("message.started", message_id="u1", role="user")) == ""
    assert t.event(ev("message.delta", message_id="u1", text="hi")) == ""
    assert t.event(ev("message.completed", message_id="u1", role="user", text="hi")) == ""
    t.event(ev("run.started"))
    assert t.event(ev("run.completed", final_message_text="done")) == AGENT_PREFIX + "done\n"
    failed = t.event(ev("run.failed", error={"code": "provider.crashed", "message": "boom", "retryable": True}))
    assert failed == "[run failed] provider.crashed: boom\n"


def test_thoughts_stream_with_their_own_prefix_and_completing_one_leaves_the_reply_line_alone() -> None:
    t = Transcript()
    out = t.event(ev("thought.started", thought_id="th1", text=""))
    out += t.event(ev("thought.delta", thought_id="th1", text="Let me think."))
    out += t.event(ev("message.delta", message_id="m1", text="Hi"))
    # The thought's lossless completion arrives while the reply is streaming: it was shown whole.
    out += t.event(ev("thought.completed", thought_id="th1", text="Let me think."))
    out += t.event(ev("message.delta", message_id="m1", text=" there"))
    out += t.event(ev("message.completed", message_id="m1", role="assistant", text="Hi there"))
    assert out == THINKING_PREFIX + "Let me think.\n" + AGENT_PREFIX + "Hi there\n"
    # A thought whose deltas were lost is shown from its completed text.
    assert t.event(ev("thought.completed", thought_id="th2", text="Hmm.")) == THINKING_PREFIX + "Hmm.\n"


def test_permission_options_are_chosen_by_kind_not_position() -> None:
    options = [
        {"option_id": "r", "kind": "reject_once", "label": "No"},
        {"option_id": "aa", "kind": "allow_always", "label": "Always"},
        {"option_id": "a", "kind": "allow_once", "label": "Yes"},
    ]
    assert choose_option(options, allow=True) == "a"
    assert choose_option(options, allow=False) == "r"
    assert choose_option(options[1:2], allow=True) == "aa"
    assert choose_option(options[1:2], allow=False) is None


def test_status_line_shows_link_outbox_and_last_terminal() -> None:
    s = Status()
    first = s.line(now=5.0)
    assert "link not connected" in first and "no heartbeat yet" in first and "none yet" in first
    s.connected = True
    s.heartbeat({"outbox": {"lossless_pending": 3, "best_effort_dropped": 7}}, now=10.0)
    s.last_run, s.last_terminal = "run-9", "cancelled"
    line = s.line(now=12.5)
    assert "link connected" in line and "3 lossless pending, 7 best-effort dropped (heartbeat 2.5 s ago)" in line
    assert "run-9 cancelled" in line
    assert s.activity_line() == "[activity] no activity reported yet"
    s.heartbeat(
        {
            "outbox": {},
            "activity": {"provider_pid": 9, "provider_cpu_ms": 1500, "provider_rss_mb": 20.0, "provider_processes": 2},
        },
        now=13.0,
    )
    assert s.activity_line() == "[activity] provider pid 9: 2 processes, 20.0 MB, cpu 1.5 s | no output yet"


def test_boot_file_is_a_valid_owner_only_pet_payload(tmp_path: Path) -> None:
    paths = DevPaths(tmp_path, "drv-dev-test")
    paths.create()
    provider = ProviderSetup("offline", {"ANTHROPIC_API_KEY": "sk-ant-x"}, model="claude-sonnet-4-5")
    payload = boot_payload(paths, "ws://127.0.0.1:1/driver", "tok-123456", "claude-agent-sdk", provider)
    write_boot_file(paths.boot_file, payload)
    assert stat.S_IMODE(paths.boot_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(paths.session_dir.stat().st_mode) == 0o700
    boot = BOOT_DECODER.decode(paths.boot_file.read_bytes())
    # pet with no idle exit: the driver must not leave while the user is typing
    assert boot.session.kind == "pet" and boot.session.idle_exit_ms is None
    assert boot.execution.permission_policy == "supervised"
    assert boot.execution.environment == {"ANTHROPIC_API_KEY": "sk-ant-x"}
    with pytest.raises(FileExistsError):
        write_boot_file(paths.boot_file, payload)


def test_driver_environment_drops_provider_credentials_and_boot_variables() -> None:
    env = driver_environment(
        {"PATH": "/bin", "ANTHROPIC_API_KEY": "k", "OPENAI_API_KEY": "o", "AGENT_DRIVER_BOOT_FILE": "/b", "HOME": "/h"}
    )
    assert env == {"PATH": "/bin", "HOME": "/h"}


# ---- end to end: the real driver and the real Claude CLI against the offline fake ------------------


def dev_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_DRIVER")}
    for key in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "OPENAI_API_KEY", "NO_COLOR"):
        env.pop(key, None)
    return env


def stored_events(workdir: Path) -> list[dict[str, Any]]:
    with sqlite3.connect(workdir / "controlplane.sqlite3") as db:
        rows = db.execute("SELECT kind, run_id, payload FROM events ORDER BY seq").fetchall()
    return [{"kind": k, "run_id": r, "payload": json.loads(p)} for k, r, p in rows]


def leftover_boot_files(workdir: Path) -> list[Path]:
    return list(workdir.glob("sessions/*/boot.json"))


@pytest.mark.provider
@pytest.mark.timeout(300)  # a cold Claude CLI on a loaded 2-core machine
@pytest.mark.parametrize(
    ("runtime", "key"),
    [("claude-agent-sdk", "ANTHROPIC_API_KEY"), ("acp", "OPENAI_API_KEY"), ("openai-app-server", "OPENAI_API_KEY")],
)
def test_once_prints_the_streamed_reply_offline_and_exits_zero(tmp_path: Path, runtime: str, key: str) -> None:
    workdir = tmp_path / "dev"
    proc = subprocess.run(
        [*DEV, "--runtime", runtime, "--workdir", str(workdir), "--once", "[[say:hello dev]]"],
        capture_output=True,
        text=True,
        env=dev_env(),
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"OFFLINE: {key} is not set")
    assert AGENT_PREFIX + "hello dev" in lines
    assert any(line.startswith("[status] link connected") and line.endswith("completed") for line in lines)
    # It really streamed through the control plane: deltas were stored before the completed message.
    kinds = [e["kind"] for e in stored_events(workdir)]
    assert "message.delta" in kinds
    assert kinds.index("message.delta") < kinds.index("message.completed") < kinds.index("run.completed")
    assert not leftover_boot_files(workdir)
    logs = list(workdir.glob("sessions/*/driver.log"))
    assert len(logs) == 1 and "driver.stopping" in logs[0].read_text()


class Screen:
    """What `agent-driver dev` wrote to stdout so far; waits for text to appear after a cursor."""

    def __init__(self, stream: asyncio.StreamReader) -> None:
        self.stream = stream
        self.text = ""
        self.cursor = 0

    async def wait_for(self, needle: str, timeout: float = 60) -> str:
        """Everything up to and including the next `needle`; the cursor moves past it."""
        async with asyncio.timeout(timeout):
            while (at := self.text.find(needle, self.cursor)) < 0:
                chunk = await self.stream.read(4096)
                if not chunk:
                    raise AssertionError(f"stdout ended before {needle!r}:\n{self.text}")
                self.text += chunk.decode(errors="replace")
        seen = self.text[self.cursor : at + len(needle)]
        self.cursor = at + len(needle)
        return seen

    async def line_with(self, needle: str, timeout: float = 60) -> str:
        """The whole line holding the next `needle` (waits for its end)."""
        before = await self.wait_for(needle, timeout)
        rest = await self.wait_for("\n", timeout)
        return before.rsplit("\n", 1)[-1] + rest.rstrip("\n")


@pytest.mark.provider
@pytest.mark.timeout(400)
async def test_interactive_chat_through_a_pipe(tmp_path: Path) -> None:
    workdir = tmp_path / "dev"
    proc = await asyncio.create_subprocess_exec(
        *DEV,
        "--workdir",
        str(workdir),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=dev_env(),
        cwd=ROOT,
    )
    assert proc.stdin is not None and proc.stdout is not None
    screen = Screen(proc.stdout)

    async def type_line(text: str) -> None:
        assert proc.stdin is not None
        proc.stdin.write(text.encode() + b"\n")
        await proc.stdin.drain()

    try:
        assert (await screen.line_with("OFFLINE:", 30)).startswith("OFFLINE:")
        await screen.wait_for("[driver] ready", 120)

        # A typed line becomes a run; its reply streams in and a status line follows.
        await type_line("[[say:first pipe reply]]")
        assert await screen.line_with(AGENT_PREFIX) == AGENT_PREFIX + "first pipe reply"
        status = await screen.line_with("[status]")
        assert "link connected" in status and status.endswith("completed")

        # A tool call that needs approval: asked at the prompt, answered y, then it ran.
        await type_line("[[shell:touch made-by-dev.txt]]")
        await screen.wait_for("[permission] the agent asks:")
        await type_line("y")
        assert await screen.line_with("[permission] allowed") == "[permission] allowed"
        assert await screen.line_with(AGENT_PREFIX) == AGENT_PREFIX + "shell done"
        assert (await screen.line_with("[status]")).endswith("completed")
        assert (workdir / "workspace" / "made-by-dev.txt").exists()

        # Ctrl-C during a run cancels the run, not the chat.
        await type_line("[[slow]]")
        await screen.wait_for("word3")
        proc.send_signal(signal.SIGINT)
        await screen.wait_for("[dev] cancelling")
        assert "by control_plane" in await screen.line_with("[run cancelled]", 30)
        assert (await screen.line_with("[status]")).endswith("cancelled")

        await type_line("/status")
        assert "link connected" in await screen.line_with("[status]")
        # The activity line is the last heartbeat's: after a cancel that had to restart the provider
        # (a loaded machine can take the interrupt past its grace), ask again until one names it.
        async with asyncio.timeout(60):
            while "provider pid" not in await screen.line_with("[activity]"):
                await type_line("/status")
        # /shell: a terminal beside the agent, for the web console; session.stop ends it.
        await type_line("/shell")
        shell = (await screen.line_with("[dev] shell ")).split()[2]
        await type_line("/quit")
        await screen.wait_for("[dev] the driver stopped cleanly")
        async with asyncio.timeout(30):
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()

    events = stored_events(workdir)
    started = [e["payload"] for e in events if e["kind"] == "process.started"]
    assert [(p["process_id"], p["pty"], p["argv"][-1]) for p in started] == [(shell, {"cols": 120, "rows": 30}, "-l")]
    assert [e["payload"]["process_id"] for e in events if e["kind"] == "process.exited"] == [shell]
    terminals = [e["kind"] for e in events if e["kind"] in ("run.completed", "run.failed", "run.cancelled")]
    assert terminals == ["run.completed", "run.completed", "run.cancelled"]
    resolved = [e["payload"] for e in events if e["kind"] == "permission.resolved"]
    assert [(p["outcome"], p["decided_by"]) for p in resolved] == [("allowed", "control_plane")]
    assert not leftover_boot_files(workdir)


@pytest.mark.provider
@pytest.mark.timeout(400)
async def test_a_line_typed_during_a_reply_steers_and_queue_waits_its_turn(tmp_path: Path) -> None:
    """PROTOCOL §3.1 in the terminal chat: a line typed while the agent answers steers the run;
    `/queue TEXT` queues a run in the driver that the chat follows after the current one."""
    workdir = tmp_path / "dev"
    proc = await asyncio.create_subprocess_exec(
        *DEV,
        "--workdir",
        str(workdir),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=dev_env(),
        cwd=ROOT,
    )
    assert proc.stdin is not None and proc.stdout is not None
    screen = Screen(proc.stdout)

    async def type_line(text: str) -> None:
        assert proc.stdin is not None
        proc.stdin.write(text.encode() + b"\n")
        await proc.stdin.drain()

    try:
        await screen.wait_for("[driver] ready", 120)
        await type_line("[[slow:60]]")
        await screen.wait_for("word3")
        await type_line("[[say:steered in dev]]")
        assert "[[say:steered in dev]]" in await screen.line_with("[steered]")
        await screen.wait_for("steered in dev")
        assert (await screen.line_with("[status]")).endswith("completed")

        await type_line("[[slow:60]]")
        await screen.wait_for("word3")
        await type_line("/queue [[say:queued in dev]]")
        assert "it starts when the run before it ends" in await screen.line_with("[dev] queued")
        assert (await screen.line_with("[status]")).endswith("completed")  # the slow one
        await screen.wait_for("queued in dev")
        assert (await screen.line_with("[status]")).endswith("completed")  # the queued one
        await type_line("/quit")
        await screen.wait_for("[dev] the driver stopped cleanly")
        async with asyncio.timeout(30):
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()

    events = stored_events(workdir)
    finals = [e["payload"].get("final_message_text") for e in events if e["kind"] == "run.completed"]
    assert finals[0] == "steered in dev" and finals[-1] == "queued in dev" and len(finals) == 3
    assert [e["payload"]["text"] for e in events if e["kind"] == "input.steered"] == ["[[say:steered in dev]]"]
