"""Every message the driver sends to an ACP agent in real sessions validates against the ACP schema of
the pinned `@agentclientprotocol/sdk` (version and file hash pinned in tests/adapters/wire.py).

The real agents (codex-acp, claude-agent-acp) cover text, permissions allowed and rejected, cancel,
resume, a model selector and modes, attachments; they never call our fs/terminal methods, so our own
stubborn agent (in its rich variant) covers those, MCP servers of every transport, and session modes
and config options of every value type."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from agent_lab.testing.ports import allow_first, reject_first

from driver.protocol.boot import HostTool, McpServer
from driver.protocol.commands import RunInput
from tests.adapters import wire
from tests.adapters.test_acp import (  # noqa: F401 (fixtures)
    STUBBORN,
    AgentFactory,
    Harness,
    agent,
    fake_claude,
    fake_openai,
    make_adapter,
    stopper,
)
from tests.helpers import attachments as attachment_files


async def _cancelled_turn(h: Harness) -> None:
    """Cancel a turn once it streams (the harness's first message.delta must be this turn's)."""
    async with anyio.create_task_group() as tg:

        async def slow() -> None:
            await h.adapter.run("run-slow", RunInput(text="[[slow]]"))

        tg.start_soon(slow)
        await h.events.wait_for("message.delta", timeout=60)
        await h.adapter.cancel()


def _check(sent: wire.Capture, peer_prefix: str) -> list[wire.Sent]:
    schema = wire.acp_schema()
    mine = [s for s in sent.sent if s.peer.startswith(peer_prefix)]
    assert wire.problems((s, wire.acp_check(schema, s)) for s in mine) == []
    return mine


@pytest.mark.provider
async def test_real_agents_messages_match_the_schema(
    agent: AgentFactory,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent = wire.capture(monkeypatch)
    model = "gpt-5.2" if agent.name == "codex-acp" else "haiku"
    h = agent(tmp_path, model=model, system_prompt="Be brief.", permissions=None)
    picture = attachment_files.place(h.cwd, "pic.png", attachment_files.png())
    notes = attachment_files.place(h.cwd, "notes.txt", b"some notes")
    await h.adapter.start()
    await _cancelled_turn(h)
    assert (await h.run("[[say:hello]]", "run-1")).final_message_text == "hello"
    for decide, name in ((allow_first, "yes.txt"), (reject_first, "no.txt")):
        h.permissions.decide = decide
        await h.run(f"[[write:{name}:x]]", f"run-{name}")
    with anyio.fail_after(60):
        await h.adapter.run("run-att", RunInput(text="[[say:seen]]", attachments=[picture, notes]))
    sid = h.adapter.native_id
    await h.adapter.stop()
    again = agent(tmp_path, native_resume=sid)
    await again.adapter.start()
    assert again.adapter.native_id == sid

    mine = _check(sent, "acp:")
    requests = {s.method for s in mine if s.kind == "request"}
    assert {"initialize", "session/new", "session/load", "session/prompt", "session/set_config_option"} <= requests
    assert "session/cancel" in {s.method for s in mine if s.kind == "notification"}
    outcomes = {s.body["result"]["outcome"]["outcome"] for s in mine if s.method == "session/request_permission"}
    assert outcomes == {"selected"}
    assert len([s for s in mine if s.method == "session/request_permission"]) == 2


async def test_stubborn_rich_agent_messages_match_the_schema(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    stopper: Any,  # noqa: F811 (the fixture imported above)
) -> None:
    sent = wire.capture(monkeypatch)
    servers = [
        McpServer(name="docs", transport="http", url="http://127.0.0.1:9/mcp", headers_from_env={"X-Key": "DOCS_KEY"}),
        McpServer(name="local", transport="stdio", command=["/bin/true", "--flag"], env={"A": "1"}),
    ]
    options = {"mode": "yolo", "config_options": {"effort": "high", "fast": True}}

    def build(**kwargs: Any) -> Harness:
        return stopper(
            make_adapter(
                tmp_path,
                [sys.executable, str(STUBBORN), "normal"],
                env={"STUBBORN_RICH": "1"},
                environment={"DOCS_KEY": "k-0123456789"},
                mcp_servers=servers,
                host_tools=[HostTool(name="lookup", description="Look up")],
                provider_options=options,
                additional_directories=[str(tmp_path)],
                **kwargs,
            )
        )

    h = build(system_prompt="Be brief.")
    picture = attachment_files.place(h.cwd, "pic.png", attachment_files.png())
    notes = attachment_files.place(h.cwd, "notes.txt", b"some notes")
    await h.adapter.start()
    assert h.events.of("session.mode.updated")[-1]["current_mode_id"] == "yolo"
    values = {o["id"]: o["current_value"] for o in h.events.of("session.config.updated")[-1]["options"]}
    assert values == {"effort": "high", "fast": True}
    assert (await h.run("[[say:hello]]")).final_message_text == "hello"
    h.permissions.decide = allow_first
    await h.run("[[perm]]", "run-allow")
    h.permissions.decide = reject_first
    await h.run("[[perm]]", "run-reject")
    assert (await h.run("[[write:f.txt:data]]", "run-w")).final_message_text == "write ok"
    assert (await h.run("[[read:f.txt]]", "run-r")).final_message_text == "read: data"
    assert (await h.run("[[read:/etc/passwd]]", "run-r2")).final_message_text.startswith("read error")
    assert (await h.run("[[shell:echo hi]]", "run-s")).final_message_text == "exit 0: hi\n"
    assert (await h.run("[[term:echo hi]]", "run-t")).final_message_text == "term exit 0"
    with anyio.fail_after(30):
        await h.adapter.run("run-att", RunInput(text="[[echo]]", attachments=[picture, notes]))
    async with anyio.create_task_group() as tg:

        async def hang() -> None:
            await h.adapter.run("run-hang", RunInput(text="[[hang]]"))

        tg.start_soon(hang)
        await anyio.lowlevel.checkpoint()  # let the prompt go out first; the adapter re-sends the cancel anyway
        await h.adapter.cancel()
    sid = h.adapter.native_id
    await h.adapter.stop()
    again = build(native_resume=sid)
    await again.adapter.start()
    assert again.adapter.native_id == sid

    mine = _check(sent, "acp:")
    by_kind = {(s.kind, s.method) for s in mine}
    assert {
        ("request", "session/set_mode"),
        ("request", "session/set_config_option"),
        ("request", "session/load"),
        ("notification", "session/cancel"),
        ("response", "fs/write_text_file"),
        ("response", "fs/read_text_file"),
        ("response", "terminal/create"),
        ("response", "terminal/wait_for_exit"),
        ("response", "terminal/output"),
        ("response", "terminal/release"),
        ("response", "session/request_permission"),
    } <= by_kind
    new = next(s for s in mine if s.method == "session/new")
    assert {m.get("type", "stdio") for m in new.body["params"]["mcpServers"]} == {"http", "stdio"}
    blocks = {b["type"] for s in mine if s.method == "session/prompt" for b in s.body["params"]["prompt"]}
    assert {"text", "image", "resource"} <= blocks
    fast = [s for s in mine if s.method == "session/set_config_option" and s.body["params"]["configId"] == "fast"]
    assert fast[0].body["params"]["type"] == "boolean"
    # The check has teeth: a boolean option set without its type, a misnamed field.
    schema = wire.acp_schema()
    untyped = {**fast[0].body, "params": {k: v for k, v in fast[0].body["params"].items() if k != "type"}}
    assert wire.acp_check(schema, wire.Sent("acp", "request", "session/set_config_option", untyped))
    typo = {**new.body, "params": {**new.body["params"], "mcpServer": []}}
    assert wire.acp_check(schema, wire.Sent("acp", "request", "session/new", typo))
