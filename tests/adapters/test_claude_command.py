"""The Claude Code CLI's command line (driver/adapters/claude/command.py) beside the one the pinned
Claude Agent SDK builds for the same options: the driver speaks the CLI's wire itself, so this is
where an SDK upgrade that changes a flag shows first. Also: secrets stay out of argv, unusable
`provider_options` are named, and the wire's values (claude_messages, claude_control) are read strictly.
"""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from driver.adapters.claude import control
from driver.adapters.claude import messages as wire
from driver.adapters.claude.command import SDK_VERSION, Session, build
from driver.protocol.boot import ExecutionConfig, McpServer

CLI = "/opt/claude"


def sdk_command(**options: Any) -> list[str]:
    from claude_agent_sdk import ClaudeAgentOptions
    from claude_agent_sdk._internal.transport.subprocess_cli import SubprocessCLITransport

    transport = SubprocessCLITransport(prompt=None, options=ClaudeAgentOptions(cli_path=CLI, **options))  # type: ignore[arg-type]
    command: list[str] = transport._build_command()
    return command


def ours(execution: ExecutionConfig, tmp_path: Path, **kw: Any) -> list[str]:
    launch = build(
        execution,
        base_env={"PATH": "/bin"},
        state_dir=tmp_path,
        cwd=str(tmp_path),
        add_dirs=kw.pop("add_dirs", []),
        driver_text=kw.pop("driver_text", ""),
        session=kw.pop("session", Session(session_id="sid-1")),
        setting_sources=kw.pop("setting_sources", []),
        **kw,
    )
    assert launch.problems == []
    return launch.argv


def test_the_pinned_sdk_is_the_one_the_command_was_proven_against() -> None:
    assert importlib.metadata.version("claude-agent-sdk") == SDK_VERSION


def test_supervised_with_the_preset_prompt_matches_the_sdk(tmp_path: Path) -> None:
    execution = ExecutionConfig(
        revision="r", runtime="claude-agent-sdk", model="claude-sonnet-4-5", provider_options={"cli_path": CLI}
    )
    argv = ours(execution, tmp_path, driver_text="Be careful.", add_dirs=["/mem"])
    expected = sdk_command(
        system_prompt={"type": "preset", "preset": "claude_code", "append": "Be careful."},
        model="claude-sonnet-4-5",
        permission_prompt_tool_name="stdio",
        permission_mode="default",
        session_id="sid-1",
        add_dirs=["/mem"],
        include_partial_messages=True,
        setting_sources=[],
    )
    assert argv == expected


def test_full_access_with_options_and_servers_matches_the_sdk(tmp_path: Path) -> None:
    options = {
        "cli_path": CLI,
        "max_turns": 7,
        "allowed_tools": ["Read", "Bash"],
        "disallowed_tools": ["WebFetch"],
        "fallback_model": "claude-haiku-4-5",
        "effort": "high",
        "extra_args": {"debug-to-stderr": None, "foo": "bar"},
    }
    execution = ExecutionConfig(
        revision="r",
        runtime="claude-agent-sdk",
        system_prompt="Be brief.",
        permission_policy="full_access",
        provider_options=options,
        mcp_servers=[McpServer(name="docs", transport="http", url="https://mcp.example/x")],
    )
    host = {"type": "http", "url": "http://127.0.0.1:9/mcp", "headers": {"Authorization": "Bearer ${T}"}}
    argv = ours(
        execution, tmp_path, session=Session(resume="sid-0"), setting_sources=["user"], extra_servers={"host": host}
    )
    expected = sdk_command(
        system_prompt="Be brief.",
        max_turns=7,
        allowed_tools=["Read", "Bash"],
        disallowed_tools=["WebFetch"],
        fallback_model="claude-haiku-4-5",
        effort="high",
        extra_args={"debug-to-stderr": None, "foo": "bar"},
        permission_mode="bypassPermissions",
        resume="sid-0",
        mcp_servers={"docs": {"type": "http", "url": "https://mcp.example/x"}, "host": host},
        include_partial_messages=True,
        setting_sources=["user"],
    )
    assert argv == expected


def test_secrets_stay_out_of_argv_and_unusable_options_are_named(tmp_path: Path) -> None:
    execution = ExecutionConfig(
        revision="r",
        runtime="claude-agent-sdk",
        environment={"TOK": "Bearer s3cret-value"},
        mcp_servers=[McpServer(name="d", transport="http", url="https://m", headers_from_env={"Authorization": "TOK"})],
        provider_options={"permission_mode": "bypassPermissions", "hooks": {}, "mcp_servers": {}, "max_turns": 2},
    )
    launch = build(
        execution,
        base_env={"TOK": "Bearer s3cret-value"},
        state_dir=tmp_path,
        cwd=str(tmp_path),
        add_dirs=[],
        driver_text="",
        session=Session(session_id="s"),
        setting_sources=[],
    )
    assert "s3cret" not in json.dumps(launch.argv)
    assert "--permission-mode" in launch.argv and "bypassPermissions" not in launch.argv  # the policy holds
    assert sorted(p.split()[0] for p in launch.problems) == [
        "provider_options.hooks",
        "provider_options.mcp_servers",
        "provider_options.permission_mode",
    ]
    assert launch.argv[launch.argv.index("--max-turns") + 1] == "2"
    assert launch.env["PWD"] == str(tmp_path) and launch.env["CLAUDE_AGENT_SDK_VERSION"] == SDK_VERSION


def test_messages_are_read_strictly_and_unknown_kinds_are_skipped() -> None:
    assert wire.parse({"type": "rate_limit_event", "rate_limit_info": {}}) is None
    result = wire.parse({"type": "result", "subtype": "success", "is_error": False, "total_cost_usd": 0.5,
                         "user_message_uuids": ["a", 3], "api_error_status": True})  # fmt: skip
    assert isinstance(result, wire.ResultMessage)
    assert result.total_cost_usd == 0.5 and result.user_message_uuids == ["a"] and result.api_error_status is None
    message = wire.parse({"type": "assistant", "message": {"id": "m1", "model": "x", "content": [
        {"type": "text", "text": "hi"}, {"type": "tool_use", "id": "t1", "name": "Bash", "input": "not a dict"},
        {"type": "image", "source": {}}]}})  # fmt: skip
    assert isinstance(message, wire.AssistantMessage)
    assert message.content == [wire.TextBlock("hi"), wire.ToolUseBlock("t1", "Bash", {})]
    for bad in (
        {"type": "assistant"},
        {"type": "assistant", "message": {"content": [{"type": "tool_use", "name": "x"}]}},
        {"type": "result", "subtype": "success"},
        {"type": "stream_event", "event": "x"},
        {"type": "system"},
    ):
        with pytest.raises(wire.BadMessage):
            wire.parse(bad)


def test_control_frames() -> None:
    ask = control.permission_ask(
        {"subtype": "can_use_tool", "tool_name": "Bash", "input": {"command": "ls"}, "tool_use_id": "t1",
         "permission_suggestions": [{"type": "addRules", "destination": "localSettings", "rules": []}]}
    )  # fmt: skip
    assert ask.tool_use_id == "t1" and ask.suggestions[0]["destination"] == "localSettings"
    allow = control.permission_response(
        control.PermissionAnswer(True, updated_permissions=ask.suggestions), ask.tool_input
    )
    # "Allow for this session" never writes a rule into a settings file the agent's project holds.
    assert allow == {
        "behavior": "allow",
        "updatedInput": {"command": "ls"},
        "updatedPermissions": [{"type": "addRules", "destination": "session", "rules": []}],
    }
    deny = control.permission_response(control.PermissionAnswer(False, message="no", interrupt=True), {})
    assert deny == {"behavior": "deny", "message": "no", "interrupt": True}
    with pytest.raises(control.BadControl):
        control.permission_ask({"subtype": "can_use_tool", "tool_name": "Bash"})
    reply = control.reply_of(
        {"type": "control_response", "response": {"subtype": "error", "request_id": "r", "error": "x"}}
    )
    assert reply == control.Reply("r", None, "x")


# A stand-in for a CLI gone wrong (the real CLI is driven in test_claude.py): it answers initialize,
# then writes what a hostile provider might, and echoes the answers it gets to its control requests.
HOSTILE_CLI = r"""
import json, sys
def out(o): sys.stdout.write(json.dumps(o) + "\n"); sys.stdout.flush()
init = json.loads(sys.stdin.readline())
out({"type": "control_response", "response": {"subtype": "success", "request_id": init["request_id"],
     "response": {"asked": init["request"]}}})
sys.stdout.write("not json\n" + "x" * 5000 + "\n" + "[1, 2]\n")
out({"type": "assistant"})
out({"type": "control_request", "request_id": "c1", "request": {"subtype": "can_use_tool", "tool_name": "Bash",
     "input": {"command": "ls"}}})
out({"type": "system", "subtype": "echo", "answer": json.loads(sys.stdin.readline())})
out({"type": "control_request", "request_id": "c2", "request": {"subtype": "hook_callback", "callback_id": "h"}})
out({"type": "system", "subtype": "echo", "answer": json.loads(sys.stdin.readline())})
"""


async def test_hostile_output_is_reported_and_skipped_and_control_requests_are_answered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    from driver.adapters.claude import client as claude_client

    monkeypatch.setattr(claude_client, "MAX_LINE_BYTES", 1000)
    problems: list[str] = []
    asked: list[control.PermissionAsk] = []

    async def on_problem(what: str) -> None:
        problems.append(what)

    async def on_permission(ask: control.PermissionAsk) -> control.PermissionAnswer:
        asked.append(ask)
        return control.PermissionAnswer(True)

    client, answer = await claude_client.ClaudeClient.open(
        [sys.executable, "-c", HOSTILE_CLI],
        env={"PATH": "/usr/bin:/bin"},
        cwd=tmp_path,
        initialize={"agents": {"a": {}}},
        on_permission=on_permission,
        on_problem=on_problem,
    )
    try:
        assert answer == {"asked": {"subtype": "initialize", "hooks": None, "agents": {"a": {}}}}
        seen = [m async for m in client.messages()]  # ends when the stand-in exits
    finally:
        await client.close()
    assert [m.data["answer"]["response"]["subtype"] for m in seen if isinstance(m, wire.SystemMessage)] == [
        "success",
        "error",
    ]
    first = seen[0]
    assert isinstance(first, wire.SystemMessage)
    assert first.data["answer"]["response"]["response"] == {"behavior": "allow", "updatedInput": {"command": "ls"}}
    assert [a.tool_name for a in asked] == ["Bash"]
    assert problems == [
        "a line that is not JSON",
        "a line over 1000 bytes",
        "a JSON value that is not an object",
        "assistant: no message object",
    ]


# A CLI that repeats a request_id, withdraws it, then opens more permission prompts than the cap.
CONTROL_FLOOD_CLI = r"""
import json, sys
def out(o): sys.stdout.write(json.dumps(o) + "\n"); sys.stdout.flush()
def ask(rid): out({"type": "control_request", "request_id": rid,
                   "request": {"subtype": "can_use_tool", "tool_name": "Bash", "input": {"command": rid}}})
init = json.loads(sys.stdin.readline())
out({"type": "control_response", "response": {"subtype": "success", "request_id": init["request_id"], "response": {}}})
ask("dup"); ask("dup")
out({"type": "system", "subtype": "echo", "answer": json.loads(sys.stdin.readline())})
out({"type": "control_cancel_request", "request_id": "dup"})
n = int(sys.argv[1])
for i in range(n + 3):
    ask(f"c{i}")
for _ in range(3):
    out({"type": "system", "subtype": "echo", "answer": json.loads(sys.stdin.readline())})
out({"type": "system", "subtype": "done"})
sys.stdin.readline()  # stays until the driver closes it
"""


async def test_a_repeated_request_id_is_refused_and_open_permission_prompts_are_capped(tmp_path: Path) -> None:
    """A CLI that repeats an open `request_id` gets an error answer for the second (before the fix
    the second handler took the first's entry, so `control_cancel_request` could not reach the first
    and its permission stayed open for good); past `MAX_OPEN_PERMISSIONS` open `can_use_tool`s, each
    further one is answered with an error at once, and the permission port is never asked."""
    import sys

    from driver.adapters.claude import client as claude_client

    cap = claude_client.MAX_OPEN_PERMISSIONS
    open_asks: set[str] = set()
    asked: list[str] = []
    all_open = anyio.Event()

    async def on_problem(what: str) -> None:
        pass

    async def on_permission(ask: control.PermissionAsk) -> control.PermissionAnswer:
        name = str(ask.tool_input["command"])
        asked.append(name)
        open_asks.add(name)
        if len(open_asks) == cap:
            all_open.set()
        try:
            await anyio.sleep_forever()
        finally:
            open_asks.discard(name)
        raise AssertionError("unreachable")

    client, _ = await claude_client.ClaudeClient.open(
        [sys.executable, "-c", CONTROL_FLOOD_CLI, str(cap)],
        env={"PATH": "/usr/bin:/bin"},
        cwd=tmp_path,
        initialize={},
        on_permission=on_permission,
        on_problem=on_problem,
    )
    seen: list[wire.Message] = []
    try:
        with anyio.fail_after(30):
            async for m in client.messages():
                seen.append(m)
                if isinstance(m, wire.SystemMessage) and m.data.get("subtype") == "done":
                    break
            await all_open.wait()
    finally:
        await client.close()
    answers = [m.data["answer"]["response"] for m in seen if isinstance(m, wire.SystemMessage) and "answer" in m.data]
    assert answers[0] == {"subtype": "error", "request_id": "dup", "error": "control request 'dup' is already open"}
    assert [a["request_id"] for a in answers[1:]] == [f"c{i}" for i in range(cap, cap + 3)]
    assert all(a["subtype"] == "error" and "too many permission requests open" in a["error"] for a in answers[1:])
    # The withdrawn request was the one left open: none of "dup" is asked any more.
    assert asked.count("dup") == 1 and "dup" not in open_asks
    assert sorted(asked[1:]) == sorted(f"c{i}" for i in range(cap))
