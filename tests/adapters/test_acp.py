"""The `acp` adapter against real ACP agents (codex-acp, claude-agent-acp) pointed at the fake model
endpoints, and against our own stubborn agent for the misbehaviours real agents will not show on cue.

What each real agent supports, as measured here (versions pinned in package.json; times on an
unloaded 2-core machine, roughly 2-3x more under load):

| | codex-acp 0.16.0 | claude-agent-acp 0.101.0 |
| --- | --- | --- |
| start to session id | ~0.3 s | ~2.4 s (Node + Claude Code) |
| session/load (resume) | yes (needs the same CODEX_HOME) | yes |
| additionalDirectories | no | yes |
| MCP over http | yes | yes (and sse) |
| auth methods | env_var (CODEX_API_KEY / OPENAI_API_KEY), chatgpt; none needed with a custom provider | none |
| default mode | read-only: asks before edits, runs commands sandboxed | auto (decides itself): we set `default` |
| full_access mode | full-access | bypassPermissions (IS_SANDBOX=1 as root) |
| permission options | approved (allow_once), abort (reject_once) | allow-once, allow-with-updates, reject |
| reject | ends the whole turn, stopReason cancelled | the turn goes on, tool fails |
| tool names | none (we use `kind`: edit, execute) | `name`: Write, Bash |
| tool input | complete on tool_call | streams in: empty pending tool_call, then updates |
| thoughts | agent_thought_chunk | agent_thought_chunk |
| usage | usage_update with context size only | usage_update with cost, PromptResponse.usage |
| cancel → stopReason cancelled | ~20 ms | ~100-350 ms |
| exits on stdin EOF | no (SIGTERM) | yes |
| edits files through fs/* | no (native apply_patch; reported via diff content) | no (native Write; via diff) |

codex-acp quirks: it puts warnings into the reply as agent_message_chunk (e.g. "Model metadata for
`gpt-5` not found", so use a model it knows); with `unified_exec` it reports no tool call at all for a
shell command; it refuses to install its bwrap sandbox helper when CODEX_HOME is under TMPDIR (then
every command fails with "codex-linux-sandbox: No such file"), so TMPDIR must point elsewhere.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from agent_lab.testing import agents, codex_acp
from agent_lab.testing.ports import (
    RecordingEvents,
    ScriptedPermissions,
    allow_first,
    recording_ports,
    reject_first,
)

from driver.adapters.acp import models as m
from driver.adapters.acp import permissions as acp_permissions
from driver.adapters.acp import session as acp_session
from driver.adapters.acp import state as acp_state
from driver.adapters.acp.adapter import AcpAdapter
from driver.adapters.acp.turn import AcpTurn
from driver.adapters.common.base import AdapterConfig, PermissionDecision, ProviderError, TurnOutcome
from driver.adapters.common.environment import provider_env
from driver.adapters.common.jsonrpc import JsonRpcError
from driver.protocol.boot import (
    AcpConfig,
    ExecutionConfig,
    HostTool,
    McpServer,
    NativeResume,
    RecoveryMessage,
    SessionConfig,
    Skill,
)
from driver.protocol.commands import RunInput
from driver.protocol.events import validate_payload
from tests.helpers import attachments as attachment_files
from tests.helpers import skills as skill_archives

ROOT = Path(__file__).resolve().parents[2]
STUBBORN = agents.STUBBORN
CLAUDE_ACP = ROOT / "node_modules" / "@agentclientprotocol" / "claude-agent-acp" / "dist" / "index.js"
CODEX_ACP = ROOT / "node_modules" / "@zed-industries" / "codex-acp-linux-x64" / "bin" / "codex-acp"


# ---- building an adapter ----------------------------------------------------------------------


@dataclass
class Harness:
    adapter: AcpAdapter
    events: RecordingEvents
    permissions: ScriptedPermissions
    cwd: Path
    agent_name: str = "stubborn"
    fake: Any = None  # the fake model endpoint a real agent talks to
    host_tools: Any = None  # the EchoHostTools port double

    async def run(self, text: str, run_id: str = "run-1", timeout: float = 60) -> TurnOutcome:
        with anyio.fail_after(timeout):
            return await self.adapter.run(run_id, RunInput(text=text))


def make_adapter(
    tmp_path: Path,
    command: list[str],
    *,
    env: dict[str, str] | None = None,
    environment: dict[str, str] | None = None,
    permissions: ScriptedPermissions | None = None,
    policy: str = "supervised",
    native_resume: str | None = None,
    native_resume_runtime: str = "acp",
    recovery: list[tuple[str, str]] | None = None,
    provider_options: dict[str, Any] | None = None,
    mcp_servers: list[McpServer] | None = None,
    additional_directories: list[str] | None = None,
    memory_dir: str | None = None,
    model: str = "",
    system_prompt: str = "",
    host_tools: list[HostTool] | None = None,
    skills: list[Skill] | None = None,
) -> Harness:
    cwd = tmp_path / "ws"
    state = tmp_path / "state"
    cwd.mkdir(parents=True, exist_ok=True)
    state.mkdir(parents=True, exist_ok=True)
    execution = ExecutionConfig(
        revision="rev-1",
        runtime="acp",
        model=model,
        system_prompt=system_prompt,
        permission_policy=policy,  # type: ignore[arg-type]
        environment=environment or {},
        acp=AcpConfig(command=command, env=env or {}),
        native_resume=(
            NativeResume(runtime=native_resume_runtime, value=native_resume)  # type: ignore[arg-type]
            if native_resume
            else None
        ),
        recovery_messages=[RecoveryMessage(role=r, text=t) for r, t in (recovery or [])],  # type: ignore[arg-type]
        provider_options=provider_options or {},
        mcp_servers=mcp_servers or [],
        host_tools=host_tools or [],
        skills=skills or [],
    )
    session = SessionConfig(
        id="ses-1",
        agent_id="agt-1",
        kind="pet" if memory_dir else "cattle",
        cwd=str(cwd),
        state_dir=str(state),
        additional_directories=additional_directories or [],
        memory_dir=memory_dir,
    )
    config = AdapterConfig(
        session=session,
        execution=execution,
        state_dir=state,
        project_root=ROOT,
        env=provider_env(execution.environment, home=str(state)),
    )
    ports, events, perms = recording_ports(cwd, permissions)
    return Harness(AcpAdapter(config, ports), events, perms, cwd, host_tools=ports.host_tools)


@pytest.fixture
async def stopper() -> AsyncIterator[Callable[[Harness], Harness]]:
    """Registers harnesses whose adapters must be stopped at the end of the test, pass or fail."""
    started: list[Harness] = []

    def register(h: Harness) -> Harness:
        started.append(h)
        return h

    yield register
    for h in started:
        with anyio.fail_after(10):
            await h.adapter.stop()


def stubborn(tmp_path: Path, mode: str = "normal", **kwargs: Any) -> Harness:
    return make_adapter(tmp_path, [sys.executable, str(STUBBORN), mode], **kwargs)


# ---- the turn mapping, without an agent -------------------------------------------------------


def test_turn_maps_chunks_tools_and_unknown_updates() -> None:
    turn = AcpTurn("run-9")
    out = turn.feed({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "Hel"}})
    out += turn.feed({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "lo"}})
    out += turn.feed({"sessionUpdate": "brand_new_variant", "whatever": 1})
    out += turn.feed({"sessionUpdate": "tool_call", "toolCallId": "t1", "title": "ls", "kind": "execute"})
    tool_text = {"type": "content", "content": {"type": "text", "text": "a\n"}}
    out += turn.feed(
        {"sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": "in_progress", "content": [tool_text]}
    )
    more = {"type": "content", "content": {"type": "text", "text": "a\nb\n"}}
    out += turn.feed(
        {"sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": "in_progress", "content": [more]}
    )
    out += turn.feed({"sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": "completed"})
    out += turn.feed({"sessionUpdate": "plan", "entries": [{"content": "x", "priority": "low", "status": "pending"}]})
    out += turn.feed({"sessionUpdate": "tool_call", "toolCallId": "t2", "title": "never finished"})
    out += turn.finish("end_turn")
    kinds = [k for k, _ in out]
    assert kinds == [
        "message.started",
        "message.delta",
        "message.delta",
        "message.completed",
        "tool.started",
        "tool.output.delta",
        "tool.output.delta",
        "tool.completed",
        "plan.updated",
        "tool.started",
        "tool.completed",
    ]
    assert out[3][1] == {"message_id": "run-9-msg-1", "role": "assistant", "text": "Hello"}
    assert [p["text"] for k, p in out if k == "tool.output.delta"] == ["a\n", "b\n"]
    assert out[7][1]["status"] == "completed" and out[7][1]["output"] == "a\nb\n"
    assert out[-1][1] == {"tool_call_id": "t2", "status": "failed", "output": None, "exit_code": None}
    assert turn.unknown_updates == {"brand_new_variant": 1}
    assert (turn.final_message_id, turn.final_message_text) == ("run-9-msg-1", "Hello")


def test_turn_announces_a_pending_tool_once_its_input_is_known() -> None:
    # claude-agent-acp: an empty pending tool_call, then its input streams in, then it runs.
    turn = AcpTurn("r")
    assert turn.feed({"sessionUpdate": "tool_call", "toolCallId": "b1", "status": "pending", "rawInput": {}}) == []
    describe = {"type": "content", "content": {"type": "text", "text": "Run echo hi"}}
    update = {"sessionUpdate": "tool_call_update", "toolCallId": "b1", "name": "Bash", "title": "echo hi"}
    assert turn.feed({**update, "rawInput": {"command": "echo hi"}, "content": [describe]}) == []
    out = turn.feed({"sessionUpdate": "tool_call_update", "toolCallId": "b1", "status": "completed", "rawOutput": "hi"})
    assert out == [
        ("tool.started", {"tool_call_id": "b1", "name": "Bash", "title": "echo hi", "input": {"command": "echo hi"}}),
        ("tool.completed", {"tool_call_id": "b1", "status": "completed", "output": "hi", "exit_code": None}),
    ]
    assert turn.started_tool_ids == ["b1"]


def test_turn_declined_tool_is_completed_once() -> None:
    turn = AcpTurn("r")
    call = m.ToolCall(tool_call_id="t9", title="rm -rf", kind="execute")
    assert [k for k, _ in turn.announce_tool(call)] == ["tool.started"]
    assert turn.announce_tool(call) == []
    assert turn.decline_tool("t9")[0][1]["status"] == "declined"
    # The agent then reports the tool failed: no second terminal for it.
    assert turn.feed({"sessionUpdate": "tool_call_update", "toolCallId": "t9", "status": "failed"}) == []
    assert turn.finish("end_turn") == []


def test_permission_answers_by_kind() -> None:
    options = acp_permissions.offered(
        [
            m.PermissionOption(option_id="z", kind="reject_once", name="No"),
            m.PermissionOption(option_id="y", kind="allow_always", name="Always"),
            m.PermissionOption(option_id="x", kind="allow_once", name="Yes"),
            m.PermissionOption(option_id="w", kind="something_new", name="?"),
        ]
    )
    assert [o.option_id for o in options] == ["z", "y", "x"]
    selected = lambda oid: ({"outcome": {"outcome": "selected", "optionId": oid}}, False)  # noqa: E731
    # The option the decision names, when offered with a fitting kind.
    assert acp_permissions.answer(options, PermissionDecision("allowed", "y", "allow_always")) == selected("y")
    # A foreign id: by the decision's kind, then the first allow kind.
    assert acp_permissions.answer(options, PermissionDecision("allowed", "nope", "allow_always")) == selected("y")
    assert acp_permissions.answer(options, PermissionDecision("allowed", None)) == selected("x")
    # An allow decision naming a reject option is not honoured as a rejection.
    assert acp_permissions.answer(options, PermissionDecision("allowed", "z")) == selected("x")
    assert acp_permissions.answer(options, PermissionDecision("timed_out", None)) == (
        {"outcome": {"outcome": "selected", "optionId": "z"}},
        True,
    )
    assert acp_permissions.answer(options, PermissionDecision("cancelled", None)) == (acp_permissions.CANCELLED, False)
    # Nothing to reject with: cancelled, the outcome every agent accepts.
    allow_only = [o for o in options if o.kind.startswith("allow")]
    assert acp_permissions.answer(allow_only, PermissionDecision("rejected", None)) == (acp_permissions.CANCELLED, True)


def test_session_mode_and_model_choice() -> None:
    modes = m.SessionModeState(
        current_mode_id="auto",
        available_modes=[m.SessionMode(id=i) for i in ("default", "auto", "bypassPermissions")],
    )
    supervised = ExecutionConfig(revision="r", runtime="acp")
    full = ExecutionConfig(revision="r", runtime="acp", permission_policy="full_access")
    chosen = ExecutionConfig(revision="r", runtime="acp", provider_options={"mode": "auto"})
    assert acp_session.wanted_mode(supervised, modes) == "default"
    assert acp_session.wanted_mode(full, modes) == "bypassPermissions"
    assert acp_session.wanted_mode(chosen, modes) is None  # already current
    selector = m.ConfigOption(
        id="model",
        category="model",
        current_value="a",
        options=[{"value": "a"}, {"group": "more", "options": [{"value": "b"}]}],
    )
    assert acp_session.model_choice("b", [selector]) == ("model", "b")
    assert acp_session.model_choice("a", [selector]) is None
    assert acp_session.model_choice("zzz", [selector]) is None


# ---- our own stubborn agent: client methods and misbehaviour ----------------------------------


async def test_stubborn_text_permissions_by_kind_and_terminal(tmp_path: Path, stopper: Any) -> None:
    h = stopper(stubborn(tmp_path))
    await h.adapter.start()
    resume = h.events.of("runtime.resume.updated")
    assert resume and resume[0]["value"].startswith("stub-")

    out = await h.run("hello")
    assert out.status == "completed" and out.final_message_text == "Hello from the stubborn agent."

    # Options are offered reject, allow_always, allow_once with unrelated ids: we answer by kind.
    h.permissions.decide = lambda req: PermissionDecision("allowed", None, "allow_once")
    out = await h.run("[[perm]]", "run-2")
    assert out.final_message_text == "permission allow_once"
    h.permissions.decide = reject_first
    out = await h.run("[[perm-unannounced]]", "run-3")
    assert out.final_message_text == "permission reject_once"
    # The unannounced tool call still got a tool.started (from the request) and ends declined.
    req = h.permissions.requests[-1]
    started = [p for p in h.events.of("tool.started") if p["tool_call_id"] == req.tool_call_id]
    completed = [p for p in h.events.of("tool.completed") if p["tool_call_id"] == req.tool_call_id]
    assert len(started) == 1 and [c["status"] for c in completed] == ["declined"]

    # A timeout is a rejection to the agent (PROTOCOL §6.2), chosen by kind.
    h.permissions.decide = lambda req: PermissionDecision("timed_out", None)
    out = await h.run("[[perm]]", "run-3b")
    assert out.final_message_text == "permission reject_once"
    assert h.events.of("tool.completed")[-1]["status"] == "declined"

    out = await h.run("[[shell:printf 'hi there'; exit 3]]", "run-4")
    assert out.final_message_text == "exit 3: hi there"


async def test_stubborn_full_access_allows_without_asking(tmp_path: Path, stopper: Any) -> None:
    """An agent with no "never ask" mode still asks under full_access: we allow by kind, silently."""
    h = stopper(stubborn(tmp_path, policy="full_access", permissions=ScriptedPermissions(reject_first)))
    await h.adapter.start()
    out = await h.run("[[perm]]")
    assert out.final_message_text == "permission allow_once"
    assert h.permissions.requests == []


async def test_stubborn_fs_admission(tmp_path: Path, stopper: Any) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    h = stopper(stubborn(tmp_path))
    (h.cwd / "escape").symlink_to(outside)
    await h.adapter.start()

    out = await h.run("[[write:notes/a.txt:hello]]")
    assert out.final_message_text == "write ok"
    assert (h.cwd / "notes" / "a.txt").read_text() == "hello"
    out = await h.run("[[write:notes/a.txt:hello again]]", "run-2")
    changes = h.events.of("file.changed")
    assert [(c["path"], c["change"]) for c in changes] == [("notes/a.txt", "created"), ("notes/a.txt", "modified")]
    assert changes[0]["sha256"] == "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"

    out = await h.run(f"[[write:{outside}/x.txt:nope]]", "run-3")
    assert out.final_message_text.startswith("write error: -32602 access denied: path is outside the allowed roots")
    out = await h.run("[[write:escape/y.txt:nope]]", "run-4")
    assert out.final_message_text.startswith("write error: -32602 access denied")
    assert list(outside.iterdir()) == []
    assert len(h.events.of("file.changed")) == 2

    out = await h.run("[[read:notes/a.txt]]", "run-5")
    assert out.final_message_text == "read: hello again"
    out = await h.run("[[read:missing.txt]]", "run-6")
    assert out.final_message_text.startswith(f"read error: {m.RESOURCE_NOT_FOUND} file not found")


async def test_stubborn_stop_reasons_and_prompt_errors(tmp_path: Path, stopper: Any) -> None:
    h = stopper(stubborn(tmp_path))
    await h.adapter.start()
    for reason in ("max_tokens", "max_turn_requests", "refusal"):
        out = await h.run(f"[[say:partial]] [[stop:{reason}]]", f"run-{reason}")
        assert (out.status, out.stop_reason, out.error_code) == ("failed", reason, reason)
        assert out.final_message_text == "partial"
    out = await h.run("[[say:so far]] [[error]]", "run-error")
    assert (out.status, out.error_code) == ("failed", "provider.error")
    assert out.error_message is not None and "scripted failure" in out.error_message
    assert h.events.of("message.completed")[-1]["text"] == "so far"


async def test_client_method_handler_directly(tmp_path: Path, stopper: Any) -> None:
    """The handler the agent calls, driven directly: unknown methods, bad params, output limits."""
    h = stopper(stubborn(tmp_path))
    await h.adapter.start()
    handler = h.adapter._on_request
    with pytest.raises(JsonRpcError) as err:
        await handler("fs/delete_everything", {})
    assert err.value.code == m.METHOD_NOT_FOUND
    with pytest.raises(JsonRpcError) as err:
        await handler("fs/write_text_file", {"sessionId": "s", "path": "x"})
    assert err.value.code == m.INVALID_PARAMS and "content" in err.value.message
    with pytest.raises(JsonRpcError) as err:
        await handler("fs/write_text_file", {"sessionId": "s", "path": "/etc/passwd", "content": "x"})
    assert "outside the allowed roots" in err.value.message

    created = await handler(
        "terminal/create",
        {"sessionId": "s", "command": "sh", "args": ["-c", "printf 'é%.0s' $(seq 100)"], "outputByteLimit": 51},
    )
    tid = created["terminalId"]
    with anyio.fail_after(10):
        assert await handler("terminal/wait_for_exit", {"sessionId": "s", "terminalId": tid}) == {
            "exitCode": 0,
            "signal": None,
        }
    output = await handler("terminal/output", {"sessionId": "s", "terminalId": tid})
    # 51 bytes kept from the end, the cut moved to a character boundary: 25 two-byte characters.
    assert output["truncated"] is True and output["output"] == "é" * 25

    sleeper = await handler("terminal/create", {"sessionId": "s", "command": "sleep", "args": ["30"]})
    await handler("terminal/kill", {"sessionId": "s", "terminalId": sleeper["terminalId"]})
    with anyio.fail_after(10):
        status = await handler("terminal/wait_for_exit", {"sessionId": "s", "terminalId": sleeper["terminalId"]})
    assert status == {"exitCode": None, "signal": "SIGKILL"}
    await handler("terminal/release", {"sessionId": "s", "terminalId": tid})
    with pytest.raises(JsonRpcError):
        await handler("terminal/output", {"sessionId": "s", "terminalId": tid})


async def test_stubborn_cancel_mid_stream(tmp_path: Path, stopper: Any) -> None:
    h = stopper(stubborn(tmp_path))
    await h.adapter.start()
    outcome: list[TurnOutcome] = []
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:

            async def go() -> None:
                outcome.append(await h.adapter.run("run-1", RunInput(text="[[slow]]")))

            tg.start_soon(go)
            await h.events.wait_for("message.delta")
            await h.adapter.cancel()
    assert outcome[0].status == "cancelled" and outcome[0].stop_reason == "cancelled"
    completed = h.events.of("message.completed")
    assert len(completed) == 1 and completed[0]["text"].startswith("word0 ")
    # The session is still usable.
    assert (await h.run("again", "run-2")).status == "completed"


async def test_stubborn_cancel_before_the_prompt_is_written(tmp_path: Path, stopper: Any) -> None:
    """A cancel that overtakes the prompt on the pipe is re-sent until the turn ends."""
    h = stopper(stubborn(tmp_path))
    await h.adapter.start()
    outcome: list[TurnOutcome] = []
    with anyio.fail_after(5):  # the [[slow]] stream lasts 20 s if the cancel is lost
        async with anyio.create_task_group() as tg:

            async def go() -> None:
                outcome.append(await h.adapter.run("run-1", RunInput(text="[[slow]]")))

            tg.start_soon(go)
            while h.adapter._turn is None:
                await anyio.lowlevel.checkpoint()
            await h.adapter.cancel()
    assert outcome[0].status == "cancelled"


async def test_stubborn_ignores_cancel_then_stop_kills_it(tmp_path: Path, stopper: Any) -> None:
    h = stopper(stubborn(tmp_path, "ignore-cancel"))
    await h.adapter.start()
    groups = h.adapter.process_group_ids()
    assert len(groups) == 1
    async with anyio.create_task_group() as tg:
        tg.start_soon(h.adapter.run, "run-1", RunInput(text="[[slow]]"))
        await h.events.wait_for("message.delta")
        await h.adapter.cancel()
        at_cancel = len(h.events.of("message.delta"))
        # The agent keeps streaming after session/cancel (and its re-sends): this is what the
        # kernel's escalation to signals is for.
        with anyio.fail_after(10):
            # 80 chunks x 50 ms: past the last of the three re-sent cancels (1, 2 and 3 s).
            while len(h.events.of("message.delta")) < at_cancel + 80:
                await h.events._changed.wait()
        assert h.adapter._turn is not None  # the turn is still running
        tg.cancel_scope.cancel()
    with anyio.fail_after(10):
        await h.adapter.stop()
    with pytest.raises(ProcessLookupError):
        os.killpg(groups[0], 0)


async def test_stubborn_exit_mid_turn_is_provider_crashed(tmp_path: Path, stopper: Any) -> None:
    h = stopper(stubborn(tmp_path, "exit-mid-turn"))
    await h.adapter.start()
    with pytest.raises(ProviderError) as err:
        await h.run("anything")
    assert err.value.code == "provider.crashed"
    assert "exiting mid-turn on purpose" in err.value.details["stderr_tail"]
    assert err.value.details["exit_code"] == 3
    # The partial message was still closed with what had arrived.
    assert h.events.of("message.completed")[0]["text"] == "About to vanish"


async def test_stubborn_no_init_times_out(tmp_path: Path, stopper: Any) -> None:
    h = stopper(stubborn(tmp_path, "no-init"))
    h.adapter.start_timeout = 1.0
    groups: list[int] = []

    async def note_group() -> None:
        while h.adapter._proc is None:
            await anyio.lowlevel.checkpoint()
        groups.append(h.adapter._proc.pgid)

    async with anyio.create_task_group() as tg:
        tg.start_soon(note_group)
        with pytest.raises(ProviderError) as err:
            await h.adapter.start()
    assert err.value.code == "provider.start_timeout"
    # The half-started agent was not left running.
    assert h.adapter.process_group_ids() == []
    with pytest.raises(ProcessLookupError):
        os.killpg(groups[0], 0)


async def test_stubborn_resume_and_reset(tmp_path: Path, stopper: Any) -> None:
    first = stopper(stubborn(tmp_path))
    await first.adapter.start()
    sid = first.adapter.native_id
    assert sid is not None
    await first.adapter.stop()

    again = stopper(stubborn(tmp_path / "b", native_resume=sid))
    await again.adapter.start()
    assert again.adapter.native_id == sid and again.events.of("runtime.session.reset") == []

    lost = stopper(
        stubborn(
            tmp_path / "c",
            native_resume="gone-123",
            recovery=[("user", "my name is Ada"), ("assistant", "hello Ada")],
        )
    )
    await lost.adapter.start()
    reset = lost.events.of("runtime.session.reset")
    assert reset == [{"previous": "gone-123", "current": lost.adapter.native_id}]
    out = await lost.run("[[echo]] first")
    assert "user: my name is Ada\nassistant: hello Ada" in out.final_message_text
    assert out.final_message_text.endswith("[[echo]] first")
    # Replayed once, on the first turn only.
    out = await lost.run("[[echo]] second", "run-2")
    assert out.final_message_text == "[[echo]] second"

    # reset(): a fresh native session, announced like any other.
    previous, current = await lost.adapter.reset()
    assert previous == reset[0]["current"] and current not in (None, previous)
    assert lost.events.of("runtime.resume.updated")[-1] == {"runtime": "acp", "value": current}

    # A resume id of another runtime cannot be loaded: fresh session, reported.
    other = stopper(stubborn(tmp_path / "d", native_resume=sid, native_resume_runtime="openai-app-server"))
    await other.adapter.start()
    assert other.events.of("runtime.session.reset") == [{"previous": sid, "current": other.adapter.native_id}]


async def test_stubborn_env_var_authentication(tmp_path: Path, stopper: Any) -> None:
    env = {"STUBBORN_AUTH_VAR": "STUB_TOKEN"}
    ok = stopper(stubborn(tmp_path / "ok", env=env, environment={"STUB_TOKEN": "tok-0123456789"}))
    await ok.adapter.start()
    assert ok.adapter.native_id is not None

    missing = stopper(stubborn(tmp_path / "missing", env=env))
    with pytest.raises(ProviderError) as err:
        await missing.adapter.start()
    assert err.value.code == "provider.auth_required"
    assert "STUB_TOKEN" in err.value.message


async def test_stubborn_session_gets_mcp_servers_and_directories(tmp_path: Path, stopper: Any) -> None:
    extra, memory = tmp_path / "extra", tmp_path / "memory"
    h = stopper(
        stubborn(
            tmp_path,
            environment={"MCP_TOKEN": "Bearer s3cret-value"},
            mcp_servers=[
                McpServer(
                    name="docs",
                    transport="http",
                    url="https://mcp.example/docs",
                    headers_from_env={"Authorization": "MCP_TOKEN"},
                ),
                McpServer(name="local", transport="stdio", command=["mcp-local", "--fast"], env={"LEVEL": "2"}),
                # The name `host` is reserved for the host tools' server.
                McpServer(name="host", transport="http", url="https://impostor.example/"),
            ],
            additional_directories=[str(extra)],
            memory_dir=str(memory),
            host_tools=[HostTool(name="echo")],
        )
    )
    await h.adapter.start()
    out = await h.run("[[session]]")
    params = json.loads(out.final_message_text)
    assert params["cwd"] == str(h.cwd.resolve())
    assert params["additionalDirectories"] == [str(extra), str(memory)]
    host = h.adapter._host
    assert host is not None
    assert [d["message"] for d in h.events.of("diagnostic.reported")] == [
        "mcp server 'host': the name is reserved for host_tools; skipped"
    ]
    assert params["mcpServers"] == [
        {
            "type": "http",
            "name": "host",
            "url": host.url,
            "headers": [{"name": "Authorization", "value": f"Bearer {host.token}"}],
        },
        {
            "type": "http",
            "name": "docs",
            "url": "https://mcp.example/docs",
            "headers": [{"name": "Authorization", "value": "Bearer s3cret-value"}],
        },
        {"name": "local", "command": "mcp-local", "args": ["--fast"], "env": [{"name": "LEVEL", "value": "2"}]},
    ]


# ---- real agents ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fake_openai() -> Iterator[Any]:
    from agent_lab.testing.fake_responses import FakeResponses

    with FakeResponses() as fake:
        yield fake


@pytest.fixture(scope="module")
def fake_claude() -> Iterator[Any]:
    from agent_lab.testing.fake_anthropic import FakeAnthropic

    with FakeAnthropic() as fake:
        yield fake


class AgentFactory:
    """Builds harnesses around one real ACP agent, pointed at its fake model endpoint."""

    def __init__(self, name: str, request: pytest.FixtureRequest, register: Callable[[Harness], Harness]):
        self.name = name
        self._request = request
        self._register = register

    def __call__(self, tmp_path: Path, **kwargs: Any) -> Harness:
        state = tmp_path / "state"
        state.mkdir(parents=True, exist_ok=True)
        if self.name == "codex-acp":
            fake = self._request.getfixturevalue("fake_openai")
            home = codex_acp.write_home(state / "codex", fake.base_url, "FAKE_OPENAI_API_KEY")
            # codex-acp refuses to install its sandbox helper under the temp dir, and CODEX_HOME is
            # under /tmp here: a TMPDIR elsewhere keeps bwrap sandboxing working.
            (state / "tmp").mkdir(exist_ok=True)
            env = {"CODEX_HOME": str(home), "TMPDIR": str(state / "tmp")}
            command = [str(CODEX_ACP)]
            environment = {"FAKE_OPENAI_API_KEY": "sk-fake-openai-0123456789"}
        else:
            fake = self._request.getfixturevalue("fake_claude")
            env = {
                "ANTHROPIC_BASE_URL": fake.base_url,
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                "CLAUDE_CONFIG_DIR": str(state / "claude"),
                "CLAUDE_CODE_MAX_RETRIES": "0",
                "IS_SANDBOX": "1",
            }
            command = ["node", str(CLAUDE_ACP)]
            environment = {"ANTHROPIC_API_KEY": "sk-ant-fake-0123456789"}
        h = make_adapter(tmp_path, command, env=env, environment=environment, **kwargs)
        h.agent_name, h.fake = self.name, fake
        return self._register(h)


@pytest.fixture(params=["codex-acp", "claude-agent-acp"])
def agent(request: pytest.FixtureRequest, stopper: Any) -> AgentFactory:
    return AgentFactory(request.param, request, stopper)


def last_request_with(fake: Any, text: str) -> dict[str, Any]:
    """The latest agent-loop model request (one offering tools) mentioning `text`. A fake serves
    several tests, and Claude Code also sends tool-less side requests (a session title) quoting the
    user's text."""
    found: dict[str, Any] = next(r for r in reversed(fake.requests) if r.get("tools") and text in json.dumps(r))
    return found


async def run_until(h: Harness, text: str, kind: str, action: Callable[[], Any]) -> TurnOutcome:
    """Start a turn, wait for the first event of `kind`, call `action`, return the turn's outcome."""
    outcome: list[TurnOutcome] = []
    async with anyio.create_task_group() as tg:

        async def go() -> None:
            outcome.append(await h.adapter.run("run-1", RunInput(text=text)))

        tg.start_soon(go)
        await h.events.wait_for(kind, timeout=30)
        await action()
    return outcome[0]


@pytest.mark.provider
async def test_real_text_then_resume(agent: AgentFactory, tmp_path: Path) -> None:
    # execution.model picks a value of the agent's "model" config selector.
    model = "gpt-5.2" if agent.name == "codex-acp" else "haiku"
    (tmp_path / "ws").mkdir()
    installed = await skill_archives.install_all(tmp_path / "ws", tmp_path / "archives")
    memory = tmp_path / "memory"
    memory.mkdir()
    h = agent(
        tmp_path,
        model=model,
        system_prompt="Always answer like a lighthouse keeper.",
        skills=installed,
        memory_dir=str(memory),
    )
    await h.adapter.start()
    assert h.events.of("diagnostic.reported") == []
    sid = h.adapter.native_id
    assert sid and h.events.of("runtime.resume.updated") == [{"runtime": "acp", "value": sid}]
    out = await h.run("[[think]] [[say:The sky is teal today.]]")
    assert out.status == "completed" and out.stop_reason == "end_turn"
    assert out.final_message_text == "The sky is teal today."
    turn_request = last_request_with(h.fake, "The sky is teal today.")
    assert model in turn_request["model"]
    # claude-agent-acp takes ACP's (unstable) session systemPrompt, appended to its own instructions;
    # codex-acp takes none, so the same text goes ahead of the session's first prompt.
    where = json.dumps(turn_request.get("system") if agent.name == "claude-agent-acp" else turn_request["input"])
    assert "Always answer like a lighthouse keeper." in where
    assert "outputs/" in where and str(memory) in where
    for name, description in skill_archives.SKILLS:
        assert f"- {name}: {description} (file: {tmp_path / 'ws' / '.skills' / name / 'SKILL.md'})" in where
    thoughts = h.events.of("thought.completed")
    assert len(thoughts) == 1 and "think about this carefully" in thoughts[0]["text"]
    if h.agent_name == "claude-agent-acp":
        # Only claude-agent-acp reports usage (usage_update with cost, PromptResponse.usage).
        assert out.usage is not None and out.usage["input_tokens"] > 0 and out.usage["cost_usd"] > 0
        assert h.events.of("usage.updated")
    started = h.events.of("message.started")
    assert len(started) == 1 and started[0]["message_id"] == out.final_message_id
    deltas = "".join(p["text"] for p in h.events.of("message.delta"))
    assert deltas == "The sky is teal today."
    await h.adapter.stop()

    # A new agent process (same state dir, as for a pet) loads the session: the model sees the
    # earlier turn in its history.
    again = agent(tmp_path, native_resume=sid)
    await again.adapter.start()
    assert again.adapter.native_id == sid and again.events.of("runtime.session.reset") == []
    out = await again.run("[[say:resumed]]", "run-2")
    assert out.final_message_text == "resumed"
    assert "The sky is teal today." in json.dumps(last_request_with(again.fake, "[[say:resumed]]"))


@pytest.mark.provider
async def test_real_permission_allowed_then_rejected(agent: AgentFactory, tmp_path: Path) -> None:
    h = agent(tmp_path, permissions=ScriptedPermissions(allow_first))
    await h.adapter.start()
    for decide, name in ((allow_first, "allowed.txt"), (reject_first, "rejected.txt")):
        h.permissions.decide = decide
        asked = len(h.permissions.requests)
        out = await h.run(f"[[write:{name}:hello]]", f"run-{name}")
        # codex-acp's only reject option ("abort") ends the turn with stopReason cancelled; that is
        # not a cancel of the run.
        codex_reject = h.agent_name == "codex-acp" and decide is reject_first
        assert out.status == "completed"
        assert out.stop_reason == ("permission_rejected" if codex_reject else "end_turn")
        assert len(h.permissions.requests) == asked + 1
        req = h.permissions.requests[-1]
        assert {o.kind for o in req.options} >= {"allow_once", "reject_once"}
        started = [p for p in h.events.of("tool.started") if p["tool_call_id"] == req.tool_call_id]
        # Announced once, with its input (not the empty placeholder of a still-streaming call).
        assert len(started) == 1 and started[0]["input"] and started[0]["title"]
        statuses = [p["status"] for p in h.events.of("tool.completed") if p["tool_call_id"] == req.tool_call_id]
        target = h.cwd / name
        changes = [c for c in h.events.of("file.changed") if c["path"] == name]
        if decide is allow_first:
            assert target.read_text().strip() == "hello"
            assert statuses == ["completed"]
            # The agent wrote natively; the tool's diff still yields a file.changed.
            digest = hashlib.sha256(target.read_bytes()).hexdigest()
            assert changes == [{"path": name, "change": "created", "sha256": digest}]
        else:
            assert not target.exists()
            assert statuses == ["declined"]
            assert changes == []


@pytest.mark.provider
async def test_real_cancel_mid_stream_and_while_permission_pending(agent: AgentFactory, tmp_path: Path) -> None:
    h = agent(tmp_path, permissions=ScriptedPermissions(hold=True))
    await h.adapter.start()
    with anyio.fail_after(10):
        out = await run_until(h, "[[slow]]", "message.delta", h.adapter.cancel)
    assert out.status == "cancelled" and out.stop_reason == "cancelled"
    # The 20 s stream (400 chunks) stopped early.
    assert len(h.events.of("message.delta")) < 200

    async def cancel_when_asked() -> None:
        await h.permissions.pending.wait()
        await h.adapter.cancel()

    with anyio.fail_after(15):
        out = await run_until(h, "[[write:notes.txt:hello]]", "tool.started", cancel_when_asked)
    assert out.status == "cancelled"
    assert not (h.cwd / "notes.txt").exists()
    tool_id = h.permissions.requests[0].tool_call_id
    statuses = [p["status"] for p in h.events.of("tool.completed") if p["tool_call_id"] == tool_id]
    # codex-acp reports nothing more (we close it cancelled); claude-agent-acp reports it failed,
    # which after a cancel means cancelled.
    assert statuses == ["cancelled"]

    # The session takes another turn after both cancels.
    assert (await h.run("[[say:still here]]", "run-3")).final_message_text == "still here"


@pytest.mark.provider
async def test_real_full_access_never_asks(agent: AgentFactory, tmp_path: Path) -> None:
    h = agent(tmp_path, policy="full_access", permissions=ScriptedPermissions(reject_first))
    await h.adapter.start()
    out = await h.run("[[write:notes.txt:hello]]")
    assert out.status == "completed" and out.final_message_text == "write done"
    assert h.permissions.requests == []
    assert (h.cwd / "notes.txt").read_text().strip() == "hello"
    assert [p["status"] for p in h.events.of("tool.completed")] == ["completed"]


ECHO_TOOL = HostTool(
    name="echo",
    description="Echo the text back",
    input_schema={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
)


@pytest.mark.provider
@pytest.mark.parametrize("agent", ["claude-agent-acp"], indirect=True)
async def test_real_host_tool_through_the_host_mcp_server(agent: AgentFactory, tmp_path: Path) -> None:
    h = agent(tmp_path, host_tools=[ECHO_TOOL], permissions=ScriptedPermissions(allow_first))
    await h.adapter.start()
    out = await h.run('[[tool:mcp__host__echo:{"text": "hi"}]]')
    assert out.status == "completed" and out.final_message_text == "tool done"
    assert h.host_tools.calls == [("echo", {"text": "hi"})]


@pytest.mark.provider
@pytest.mark.parametrize("agent", ["codex-acp"], indirect=True)
async def test_real_host_tool_offered_directly_by_codex_acp(agent: AgentFactory, tmp_path: Path) -> None:
    """codex-acp offers the host MCP tools in the request's tools (an `mcp__host` namespace), with no
    tool search first: the call still reaches the host-tools port and its answer the model."""
    h = agent(tmp_path, host_tools=[ECHO_TOOL], permissions=ScriptedPermissions(allow_first))
    await h.adapter.start()
    out = await h.run('[[mcp:host:echo:{"text": "hi"}]]')
    assert out.status == "completed" and out.final_message_text.startswith("mcp done"), out
    assert h.host_tools.calls == [("echo", {"text": "hi"})]


@pytest.mark.provider
async def test_real_image_and_text_attachments(agent: AgentFactory, tmp_path: Path) -> None:
    h = agent(tmp_path)
    image = attachment_files.png()
    picture = attachment_files.place(h.cwd, "pic.png", image)
    notes = attachment_files.place(h.cwd, "notes.txt", b"the password is swordfish")
    await h.adapter.start()
    caps = h.adapter.agent.agent_capabilities.prompt_capabilities  # type: ignore[union-attr]
    assert caps.image  # both real agents take images
    with anyio.fail_after(60):
        out = await h.adapter.run("run-1", RunInput(text="[[say:seen]] look at this", attachments=[picture, notes]))
    assert out.final_message_text == "seen"
    request = json.dumps(last_request_with(h.fake, "look at this"))
    assert base64.b64encode(image).decode() in request
    # A short text goes in as embedded context where the agent takes it, else as a link to the file.
    assert ("the password is swordfish" in request) == caps.embedded_context


async def test_image_for_an_agent_without_image_support_is_command_invalid(tmp_path: Path, stopper: Any) -> None:
    h = stopper(stubborn(tmp_path))
    picture = attachment_files.place(h.cwd, "pic.png", attachment_files.png())
    await h.adapter.start()
    with pytest.raises(ProviderError) as info:
        await h.adapter.run("run-1", RunInput(text="[[say:never]]", attachments=[picture]))
    assert info.value.code == "command.invalid" and "does not accept images" in info.value.message
    # Nothing was sent: the adapter is ready for the next run.
    assert (await h.run("[[say:next]]", "run-2")).final_message_text == "next"


async def test_terminal_output_streams_as_tool_output(tmp_path: Path, stopper: Any) -> None:
    h = stopper(stubborn(tmp_path))
    await h.adapter.start()
    out = await h.run("[[term:printf 'one\\n'; sleep 0.3; printf 'two\\n'; exit 4]]")
    assert out.final_message_text == "term exit 4"
    [started] = h.events.of("tool.started")
    streamed = "".join(
        p["text"] for p in h.events.of("tool.output.delta") if p["tool_call_id"] == started["tool_call_id"]
    )
    assert streamed == "one\ntwo\n"
    [done] = h.events.of("tool.completed")
    assert done["status"] == "completed" and done["exit_code"] == 4


def test_session_state_snapshots() -> None:
    state = acp_state.SessionState()
    opened = {
        "sessionId": "s",
        "modes": {"currentModeId": "auto", "availableModes": [{"id": "auto", "name": "Auto"}, {"id": "default"}]},
        "configOptions": [
            {
                "id": "model",
                "name": "Model",
                "category": "model",
                "type": "select",
                "currentValue": "a",
                "options": [{"value": "a", "name": "A"}, {"group": "g", "name": "G", "options": [{"value": "b"}]}],
            },
            {"id": "fast", "name": "Fast", "type": "boolean", "currentValue": False},
        ],
    }
    out = state.opened(opened)
    assert [k for k, _ in out] == ["session.mode.updated", "session.config.updated"]
    assert out[0][1] == {
        "current_mode_id": "auto",
        "available_modes": [
            {"id": "auto", "name": "Auto", "description": ""},
            {"id": "default", "name": "", "description": ""},
        ],
    }
    assert out[1][1]["options"] == [
        {
            "id": "model",
            "name": "Model",
            "category": "model",
            "type": "select",
            "current_value": "a",
            "choices": ["a", "b"],
        },
        {"id": "fast", "name": "Fast", "category": None, "type": "boolean", "current_value": False},
    ]
    for kind, payload in out:
        validate_payload(kind, payload)
    assert state.feed({"sessionUpdate": "current_mode_update", "currentModeId": "auto"}) == []  # no change
    assert state.mode_set("default")[0][1]["current_mode_id"] == "default"
    commands = state.feed(
        {
            "sessionUpdate": "available_commands_update",
            "availableCommands": [{"name": "review", "description": "Review changes", "input": {"hint": "branch"}}],
        }
    )
    assert commands == [
        (
            "session.commands.updated",
            {"commands": [{"name": "review", "description": "Review changes", "input_hint": "branch"}]},
        )
    ]
    assert acp_state.set_config_params("s", "fast", True) == {
        "sessionId": "s",
        "configId": "fast",
        "value": True,
        "type": "boolean",
    }
    assert "type" not in acp_state.set_config_params("s", "model", "b")


@pytest.mark.provider
async def test_real_session_state_events(agent: AgentFactory, tmp_path: Path) -> None:
    h = agent(tmp_path)
    await h.adapter.start()
    [mode] = h.events.of("session.mode.updated")[-1:]
    # Under `supervised` claude-agent-acp is switched to `default`; codex-acp starts read-only.
    assert mode["current_mode_id"] == ("default" if agent.name == "claude-agent-acp" else "read-only")
    assert any(m["id"] == mode["current_mode_id"] for m in mode["available_modes"])
    config = h.events.of("session.config.updated")[-1]
    assert any(o["category"] == "model" and o["current_value"] in o["choices"] for o in config["options"])
    if agent.name == "claude-agent-acp":
        # Its slash commands arrive after session/new, before any turn.
        commands = await h.events.wait_for("session.commands.updated", timeout=90)
        assert commands["commands"] and all(c["name"] for c in commands["commands"])
    assert "diagnostic.reported" not in h.events.kinds()


async def test_an_update_read_with_the_session_answer_is_the_new_sessions(tmp_path: Path, stopper: Any) -> None:
    """claude-agent-acp sends its slash commands right after the session/new answer. Read in the same
    chunk, the update is dispatched before the opener resumes: it belongs to the session just answered,
    not to an unknown one (CI once lost claude-agent-acp's commands this way)."""
    h = stopper(stubborn(tmp_path, env={"STUBBORN_COMMANDS": "1"}))
    await h.adapter.start()
    commands = await h.events.wait_for("session.commands.updated", timeout=10)
    assert commands == {"commands": [{"name": "review", "description": "Review the changes", "input_hint": "a path"}]}


def test_cost_is_the_runs_share_of_the_sessions_total() -> None:
    first = AcpTurn("r1")
    cost = {"sessionUpdate": "usage_update", "used": 1, "size": 9, "cost": {"amount": 0.01, "currency": "USD"}}
    assert first.feed(cost) == [("usage.updated", {"cost_usd": 0.01})]
    second = AcpTurn("r2", first.cost_total)
    later = {**cost, "cost": {"amount": 0.025, "currency": "USD"}}
    assert second.feed(later) == [("usage.updated", {"cost_usd": 0.015})]
    # A total below the last one: the agent counts from zero again (a restarted agent).
    third = AcpTurn("r3", second.cost_total)
    assert third.feed(cost) == [("usage.updated", {"cost_usd": 0.01})]
