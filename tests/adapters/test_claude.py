"""Contract tests of the Claude adapter: the REAL Claude Code CLI (bundled with claude-agent-sdk),
driven through ClaudeSDKClient, against the fake Anthropic endpoint. Only the model is faked."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from agent_lab.testing.fake_anthropic import DEFAULT_TEXT, ERROR_MESSAGE, THINKING_TEXT, FakeAnthropic
from agent_lab.testing.ports import EchoHostTools, RecordingEvents, ScriptedPermissions, recording_ports, reject_first

from driver.adapters.claude.adapter import ClaudeAdapter
from driver.adapters.common.base import AdapterConfig, PermissionDecision, ProviderError, TurnOutcome
from driver.adapters.common.environment import provider_env
from driver.ports.mcp_host import McpHostServer
from driver.protocol.boot import (
    ExecutionConfig,
    HostTool,
    McpServer,
    NativeResume,
    RecoveryMessage,
    SessionConfig,
    Skill,
)
from driver.protocol.commands import RunInput
from tests.helpers import attachments as attachment_files
from tests.helpers import skills as skill_archives

pytestmark = pytest.mark.provider

PROJECT_ROOT = Path(__file__).resolve().parents[2]
API_KEY = "sk-ant-fake-key-for-tests"
SUBAGENT_TOOL = "Agent"  # Claude Code 2.1 calls its subagent tool Agent (formerly Task)


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as server:
        yield server


class Harness:
    def __init__(self, fake: FakeAnthropic, root: Path) -> None:
        self.fake = fake
        self.root = root
        self.cwd = root / "work"
        self.cwd.mkdir(exist_ok=True)
        self.state = root / "state"  # shared by the adapters of one test, so resume finds its session
        self.adapters: list[ClaudeAdapter] = []

    def adapter(
        self,
        policy: str = "supervised",
        *,
        permissions: ScriptedPermissions | None = None,
        native_resume: NativeResume | None = None,
        recovery: list[RecoveryMessage] | None = None,
        host_tools: list[HostTool] | None = None,
        mcp_servers: list[McpServer] | None = None,
        extra_environment: dict[str, str] | None = None,
        system_prompt: str = "",
        skills: list[Skill] | None = None,
        memory_dir: str | None = None,
    ) -> tuple[ClaudeAdapter, RecordingEvents, ScriptedPermissions]:
        environment = {"ANTHROPIC_BASE_URL": self.fake.base_url, "ANTHROPIC_API_KEY": API_KEY}
        environment.update(extra_environment or {})
        execution = ExecutionConfig(
            revision="rev-1",
            runtime="claude-agent-sdk",
            model="claude-sonnet-4-5",
            permission_policy=policy,  # type: ignore[arg-type]
            environment=environment,
            native_resume=native_resume,
            recovery_messages=recovery or [],
            host_tools=host_tools or [],
            mcp_servers=mcp_servers or [],
            system_prompt=system_prompt,
            skills=skills or [],
        )
        session = SessionConfig(
            id="ses-1",
            agent_id="agt-1",
            kind="pet" if memory_dir else "cattle",
            cwd=str(self.cwd),
            state_dir=str(self.state),
            memory_dir=memory_dir,
        )
        config = AdapterConfig(
            session=session,
            execution=execution,
            state_dir=self.state / "claude",
            project_root=PROJECT_ROOT,
            env=provider_env(environment, home=str(self.state / "home")),
        )
        ports, events, perms = recording_ports(self.cwd, permissions)
        adapter = ClaudeAdapter(config, ports)
        self.adapters.append(adapter)
        return adapter, events, perms


@pytest.fixture
async def harness(fake: FakeAnthropic, tmp_path: Path) -> AsyncIterator[Harness]:
    h = Harness(fake, tmp_path)
    try:
        yield h
    finally:
        for adapter in h.adapters:
            await adapter.stop()


def _prompts(fake: FakeAnthropic, marker: str) -> list[dict[str, Any]]:
    return [r for r in fake.requests if marker in str(r.get("messages"))]


async def _run(adapter: ClaudeAdapter, run_id: str, text: str, timeout: float = 30) -> TurnOutcome:
    with anyio.fail_after(timeout):
        return await adapter.run(run_id, RunInput(text=text))


async def test_plain_text_turn(harness: Harness) -> None:
    adapter, events, _ = harness.adapter()
    started = time.monotonic()
    await adapter.start()
    pgids = adapter.process_group_ids()
    # The CLI runs in a process group of its own, never the driver's.
    assert len(pgids) == 1 and pgids[0] != os.getpgrp()

    outcome = await _run(adapter, "run-1", "hello there")
    print(f"start to turn end: {time.monotonic() - started:.3f}s (connect {adapter.connect_seconds:.3f}s)")

    assert outcome.status == "completed"
    assert outcome.final_message_text == DEFAULT_TEXT
    completed = events.of("message.completed")
    assert [m["text"] for m in completed] == [DEFAULT_TEXT]
    assert outcome.final_message_id == completed[0]["message_id"]
    deltas = events.of("message.delta")
    assert len(deltas) > 1 and "".join(d["text"] for d in deltas) == DEFAULT_TEXT
    kinds = events.kinds()
    assert kinds.index("message.started") < kinds.index("message.delta") < kinds.index("message.completed")
    usage = events.of("usage.updated")[-1]
    assert usage["input_tokens"] and usage["input_tokens"] > 0 and usage["output_tokens"]
    assert outcome.usage == usage
    resume = events.of("runtime.resume.updated")
    assert len(resume) == 1 and resume[0]["runtime"] == "claude-agent-sdk"
    assert resume[0]["value"] == adapter.native_id
    assert "runtime.session.reset" not in kinds
    # Offline: the CLI called nothing but /v1/messages, and carried the execution's key.
    assert harness.fake.other_requests == []
    assert _prompts(harness.fake, "hello there")

    await adapter.stop()
    with pytest.raises(ProcessLookupError):
        os.killpg(pgids[0], 0)
    assert adapter.process_group_ids() == []


async def test_full_access_runs_tools_without_asking(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    # A variable of the driver's own that is not on the allowlist must not reach the CLI or its tools.
    monkeypatch.setenv("DRIVER_ONLY_CANARY", "must-not-leak")
    adapter, events, perms = harness.adapter("full_access")
    await adapter.start()
    outcome = await _run(adapter, "run-1", "[[shell:echo made > full.txt; env > env.txt]]")
    assert outcome.status == "completed" and outcome.final_message_text == "shell done"
    assert perms.requests == []
    assert (harness.cwd / "full.txt").read_text() == "made\n"
    seen = (harness.cwd / "env.txt").read_text()
    assert "CLAUDE_CONFIG_DIR=" in seen and "DRIVER_ONLY_CANARY" not in seen
    [tool] = events.of("tool.completed")
    assert tool["status"] == "completed"


async def test_supervised_tool_call_allowed(harness: Harness) -> None:
    adapter, events, perms = harness.adapter()
    await adapter.start()
    outcome = await _run(adapter, "run-1", "[[write:notes/allowed.txt:written by claude]]")

    assert outcome.status == "completed" and outcome.final_message_text == "write done"
    [request] = perms.requests
    assert request.tool_name == "Write"
    assert {o.kind for o in request.options} >= {"allow_once", "reject_once"}
    [started] = events.of("tool.started")
    assert started["tool_call_id"] == request.tool_call_id and started["name"] == "Write"
    [done] = events.of("tool.completed")
    assert done["tool_call_id"] == request.tool_call_id and done["status"] == "completed"
    assert (harness.cwd / "notes" / "allowed.txt").read_text() == "written by claude"
    kinds = events.kinds()
    assert kinds.index("tool.started") < kinds.index("tool.completed")


async def test_supervised_tool_call_denied(harness: Harness) -> None:
    adapter, events, perms = harness.adapter(permissions=ScriptedPermissions(reject_first))
    await adapter.start()
    outcome = await _run(adapter, "run-1", "[[write:denied.txt:must not exist]]")

    assert len(perms.requests) == 1
    [done] = events.of("tool.completed")
    assert done["status"] == "declined"
    assert done["tool_call_id"] == perms.requests[0].tool_call_id
    assert not (harness.cwd / "denied.txt").exists()
    assert outcome.status == "completed"
    assert outcome.final_message_text == "write done"  # the fake answers any tool result the same way


@pytest.mark.serial  # cancel to outcome within 3 s
async def test_cancel_mid_stream_then_next_turn_works(harness: Harness) -> None:
    adapter, events, _ = harness.adapter()
    await adapter.start()
    result: list[TurnOutcome] = []

    async def turn() -> None:
        result.append(await adapter.run("run-1", RunInput(text="[[slow]]")))

    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg:
            tg.start_soon(turn)
            await events.wait_for("message.delta")
            asked = time.monotonic()
            await adapter.cancel()
    elapsed = time.monotonic() - asked
    print(f"cancel to outcome: {elapsed:.3f}s")

    [outcome] = result
    assert outcome.status == "cancelled" and outcome.stop_reason == "cancelled"
    assert elapsed < 3  # the slow stream would run ~20 s
    started = {m["message_id"] for m in events.of("message.started")}
    assert started == {m["message_id"] for m in events.of("message.completed")}

    again = await _run(adapter, "run-2", "[[think]] [[say:still alive]]")
    assert again.status == "completed" and again.final_message_text == "still alive"
    [thought] = events.of("thought.completed")
    assert thought["text"] == THINKING_TEXT
    assert "".join(d["text"] for d in events.of("thought.delta")) == THINKING_TEXT


async def test_model_error_fails_the_turn_with_the_model_message(harness: Harness) -> None:
    adapter, events, _ = harness.adapter()
    await adapter.start()
    try:
        outcome = await _run(adapter, "run-1", "[[error]]")
    except ProviderError as exc:
        message = exc.message
    else:
        assert outcome.status == "failed"
        assert outcome.error_code == "provider.model_error"
        message = outcome.error_message or ""
    assert ERROR_MESSAGE in message
    assert API_KEY not in message
    # The synthetic "API Error" text is an error, not an assistant answer.
    assert events.of("message.completed") == []


async def test_resume_by_session_id(harness: Harness) -> None:
    first, first_events, _ = harness.adapter()
    await first.start()
    outcome = await _run(first, "run-1", "remember the word pineapple [[say:noted]]")
    assert outcome.final_message_text == "noted"
    session_id = first_events.of("runtime.resume.updated")[0]["value"]
    await first.stop()

    second, events, _ = harness.adapter(native_resume=NativeResume(runtime="claude-agent-sdk", value=session_id))
    await second.start()
    assert second.native_id == session_id
    outcome = await _run(second, "run-2", "what was the word? [[say:pineapple]]")
    assert outcome.status == "completed"
    # The CLI sent the earlier conversation along with the new prompt: the session really resumed.
    [request] = _prompts(harness.fake, "what was the word?")
    assert "remember the word pineapple" in str(request["messages"])
    assert "runtime.session.reset" not in events.kinds()


async def test_bogus_resume_starts_fresh_and_replays_recovery(harness: Harness) -> None:
    bogus = "00000000-0000-4000-8000-000000000000"
    recovery = [
        RecoveryMessage(role="user", text="my favourite colour is teal"),
        RecoveryMessage(role="assistant", text="noted, teal"),
    ]
    adapter, events, _ = harness.adapter(
        native_resume=NativeResume(runtime="claude-agent-sdk", value=bogus), recovery=recovery
    )
    await adapter.start()
    [reset] = events.of("runtime.session.reset")
    assert reset["previous"] == bogus and reset["current"] and reset["current"] != bogus

    outcome = await _run(adapter, "run-1", "which colour? [[say:teal]]")
    assert outcome.status == "completed"
    [request] = _prompts(harness.fake, "which colour?")
    assert "my favourite colour is teal" in str(request["messages"])
    assert events.of("runtime.resume.updated")[-1]["value"] == reset["current"]


async def test_host_tool_is_served_through_the_host_port(harness: Harness) -> None:
    schema = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
    adapter, events, perms = harness.adapter(
        host_tools=[HostTool(name="lookup", description="Look a thing up", input_schema=schema)]
    )
    await adapter.start()
    outcome = await _run(adapter, "run-1", '[[tool:mcp__host__lookup:{"q": "teal"}]]')

    assert outcome.status == "completed" and outcome.final_message_text == "tool done"
    host = adapter.ports.host_tools
    assert isinstance(host, EchoHostTools)
    assert host.calls == [("lookup", {"q": "teal"})]
    assert perms.requests == []  # the control plane decides about its own tools
    [done] = events.of("tool.completed")
    assert done["status"] == "completed" and "lookup ok" in str(done["output"])


async def test_cancel_while_a_permission_is_pending(harness: Harness) -> None:
    adapter, events, perms = harness.adapter(permissions=ScriptedPermissions(hold=True))
    await adapter.start()
    result: list[TurnOutcome] = []

    async def turn() -> None:
        result.append(await adapter.run("run-1", RunInput(text="[[write:pending.txt:never]]")))

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(turn)
            await perms.pending.wait()
            # What the kernel does on turn.cancel: resolve the pending request, then interrupt.
            perms.release(PermissionDecision("cancelled", None))
            await adapter.cancel()

    [outcome] = result
    assert outcome.status == "cancelled"
    assert not (harness.cwd / "pending.txt").exists()
    [started] = events.of("tool.started")
    [done] = events.of("tool.completed")
    assert done["tool_call_id"] == started["tool_call_id"] == perms.requests[0].tool_call_id
    assert done["status"] == "cancelled"

    # The interrupted turn leaves nothing behind that could end the next one early.
    again = await _run(adapter, "run-2", "[[say:next turn]]")
    assert again.status == "completed" and again.final_message_text == "next turn"


async def test_cli_killed_mid_turn_raises_provider_crashed(harness: Harness) -> None:
    adapter, events, _ = harness.adapter()
    await adapter.start()
    [pgid] = adapter.process_group_ids()

    async def kill_when_streaming() -> None:
        await events.wait_for("message.delta")
        os.killpg(pgid, signal.SIGKILL)

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(kill_when_streaming)
            with pytest.raises(ProviderError) as caught:
                await adapter.run("run-1", RunInput(text="[[slow]]"))
    assert caught.value.code == "provider.crashed"
    assert "stderr_tail" in caught.value.details
    await adapter.stop()  # idempotent on a dead CLI


async def test_reset_starts_a_fresh_session(harness: Harness) -> None:
    adapter, events, _ = harness.adapter()
    await adapter.start()
    await _run(adapter, "run-1", "the secret word is mango [[say:ok]]")
    before = adapter.native_id

    previous, current = await adapter.reset()
    assert previous == before and current and current != before
    outcome = await _run(adapter, "run-2", "fresh start? [[say:yes]]")
    assert outcome.final_message_text == "yes"
    [request] = _prompts(harness.fake, "fresh start?")
    assert "mango" not in str(request["messages"])  # the old conversation is gone
    assert events.of("runtime.resume.updated")[-1]["value"] == current


def _argv_of_every_process() -> dict[int, bytes]:
    out: dict[int, bytes] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    out[int(entry)] = f.read()
            except OSError:
                continue  # gone meanwhile
    return out


async def test_mcp_header_values_never_reach_argv(harness: Harness) -> None:
    """A configured HTTP MCP server's header value (a secret from `execution.environment`) reaches
    the server, but no process's argv (`--mcp-config` JSON is world-readable in /proc/<pid>/cmdline):
    the CLI gets `${VAR}` and expands it from its environment, where the value already is."""
    docs_tools = EchoHostTools()
    docs = McpHostServer([HostTool(name="search_docs", description="Search the docs")], docs_tools)
    await docs.start()
    try:
        adapter, _events, _perms = harness.adapter(
            "full_access",
            extra_environment={"DOCS_AUTH": f"Bearer {docs.token}"},
            mcp_servers=[
                McpServer(name="docs", transport="http", url=docs.url, headers_from_env={"Authorization": "DOCS_AUTH"})
            ],
        )
        await adapter.start()
        outcome = await _run(adapter, "run-1", '[[tool:mcp__docs__search_docs:{"q": "retry"}]]', timeout=60)
        leaks = {pid: argv[:200] for pid, argv in _argv_of_every_process().items() if docs.token.encode() in argv}
        assert leaks == {}
        assert outcome.status == "completed"
        assert docs_tools.calls == [("search_docs", {"q": "retry"})]  # the header did authenticate
    finally:
        await docs.close()


async def test_stdio_mcp_server_env_values_never_reach_argv(harness: Harness) -> None:
    """A stdio MCP server's `env` values are secrets too: the CLI gets `${VAR}` references in
    `--mcp-config` and their values in its environment, and the server still receives them."""
    secret = "stdio-env-SECRET-31337"
    server = McpServer(
        name="envsrv",
        transport="stdio",
        command=[sys.executable, str(PROJECT_ROOT / "tests" / "helpers" / "env_mcp_server.py"), "SERVICE_KEY"],
        env={"SERVICE_KEY": secret},
    )
    adapter, events, _perms = harness.adapter("full_access", mcp_servers=[server])
    await adapter.start()
    outcome = await _run(adapter, "run-1", "[[tool:mcp__envsrv__show_env:{}]]", timeout=60)
    leaks = {pid: argv[:200] for pid, argv in _argv_of_every_process().items() if secret.encode() in argv}
    assert leaks == {}
    assert outcome.status == "completed"
    [done] = events.of("tool.completed")
    assert f"SERVICE_KEY={secret}" in str(done["output"])


async def test_instructions_and_skills_reach_the_model(harness: Harness) -> None:
    installed = await skill_archives.install_all(harness.cwd, harness.root / "archives")
    memory = harness.root / "memory"
    memory.mkdir()
    adapter, _, _ = harness.adapter(
        system_prompt="Always answer like a ship's cook.", skills=installed, memory_dir=str(memory)
    )
    await adapter.start()
    outcome = await _run(adapter, "run-1", "[[say:aye]] instructions check")
    assert outcome.final_message_text == "aye"
    [request] = [r for r in _prompts(harness.fake, "instructions check") if r.get("tools")]
    system = json.dumps(request.get("system"))
    assert "Always answer like a ship's cook." in system
    assert "outputs/" in system and str(memory) in system  # the driver's paragraph, for a pet
    # Skills the native way: Claude Code lists the skills of its user folder to the model (in a
    # reminder in the conversation, not in our system prompt).
    listed = json.dumps(request["messages"])
    assert "skills are available for use with the Skill tool" in listed
    for name, description in skill_archives.SKILLS:
        assert f"- {name}: {description}" in listed, name
        assert f"- {name}: {harness.cwd / '.skills' / name}" in system  # where its files are
    links = sorted(p.name for p in (harness.state / "claude" / "claude-config" / "skills").iterdir())
    assert links == sorted(n for n, _ in skill_archives.SKILLS)


async def test_subagent_work_and_file_writes_are_reported(harness: Harness) -> None:
    adapter, events, _ = harness.adapter("full_access")
    (harness.cwd / "old.txt").write_text("before")
    await adapter.start()
    # The subagent's prompt holds a marker of its own, escaped so that it is not the parent's marker.
    task = {
        "description": "sub work",
        "prompt": "\\u005b\\u005bshell:echo from-sub\\u005d\\u005d",
        "run_in_background": False,  # else Claude Code runs it after the turn has ended
    }
    outcome = await _run(adapter, "run-1", f"[[tool:{SUBAGENT_TOOL}:{json.dumps(task)}]]", timeout=60)
    assert outcome.status == "completed" and outcome.final_message_text == "tool done"
    [delegating] = [p for p in events.of("tool.started") if p["name"] == SUBAGENT_TOOL]
    assert delegating["parent_tool_call_id"] is None
    [inner] = [p for p in events.of("tool.started") if p["name"] == "Bash"]
    assert inner["parent_tool_call_id"] == delegating["tool_call_id"]
    done = {p["tool_call_id"]: p["status"] for p in events.of("tool.completed")}
    assert done == {delegating["tool_call_id"]: "completed", inner["tool_call_id"]: "completed"}
    # The subagent's closing words are the delegating call's result.
    [result] = [p["output"] for p in events.of("tool.completed") if p["tool_call_id"] == delegating["tool_call_id"]]
    assert "shell done" in json.dumps(result)

    for n, content in enumerate(("fresh", "again")):
        outcome = await _run(adapter, f"run-w{n}", f"[[write:new.txt:{content}]]")
        assert outcome.final_message_text == "write done"
    # Claude Code refuses to overwrite a file it has not read: a failed tool changes nothing.
    await _run(adapter, "run-old", "[[write:old.txt:after]]")
    assert (harness.cwd / "old.txt").read_text() == "before"
    assert events.of("file.changed") == [
        {"path": "new.txt", "change": "created", "sha256": hashlib.sha256(b"fresh").hexdigest()},
        {"path": "new.txt", "change": "modified", "sha256": hashlib.sha256(b"again").hexdigest()},
    ]


async def test_image_attachment_reaches_the_model(harness: Harness) -> None:
    adapter, _, _ = harness.adapter()
    image = attachment_files.png()
    picture = attachment_files.place(harness.cwd, "pic.png", image)
    await adapter.start()
    with anyio.fail_after(30):
        outcome = await adapter.run("run-1", RunInput(text="[[say:seen]] look at this", attachments=[picture]))
    assert outcome.final_message_text == "seen"
    [request] = [r for r in _prompts(harness.fake, "look at this") if r.get("tools")]
    blocks = [b for m in request["messages"] for b in (m["content"] if isinstance(m["content"], list) else [])]
    images = [b for b in blocks if b.get("type") == "image"]
    assert [i["source"]["data"] for i in images] == [base64.b64encode(image).decode()]


async def test_cost_is_reported_per_run(harness: Harness) -> None:
    adapter, events, _ = harness.adapter()
    await adapter.start()
    first = await _run(adapter, "run-1", "[[say:one two three]]")
    second = await _run(adapter, "run-2", "[[say:one two three]]")
    costs = [o.usage["cost_usd"] if o.usage else None for o in (first, second)]
    assert all(isinstance(c, float) and c > 0 for c in costs), costs
    # Claude Code reports a running total per session; each run's usage is that run's share.
    assert costs[1] < 1.5 * costs[0]  # type: ignore[operator]
    assert [e["cost_usd"] for e in events.of("usage.updated")] == costs


async def test_subagent_permission_names_its_delegating_call(harness: Harness) -> None:
    adapter, events, perms = harness.adapter()
    await adapter.start()
    task = {
        "description": "sub work",
        "prompt": "\\u005b\\u005bshell:echo asked > sub.txt\\u005d\\u005d",
        "run_in_background": False,
    }
    outcome = await _run(adapter, "run-1", f"[[tool:{SUBAGENT_TOOL}:{json.dumps(task)}]]", timeout=60)
    assert outcome.status == "completed"
    bash = [r for r in perms.requests if r.tool_name == "Bash"]
    assert len(bash) == 1 and (harness.cwd / "sub.txt").read_text() == "asked\n"
    [delegating] = [p for p in events.of("tool.started") if p["name"] == SUBAGENT_TOOL]
    # The permission callback announced the subagent's call first: it already carries its parent.
    [inner] = [p for p in events.of("tool.started") if p["tool_call_id"] == bash[0].tool_call_id]
    assert inner["parent_tool_call_id"] == delegating["tool_call_id"]
