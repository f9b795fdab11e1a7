"""Every message the driver sends to the REAL Codex app-server in real sessions (text, approvals
allowed and declined, an MCP tool approval, cancel, an image attachment, resume) validates against the
schema the pinned Codex binary itself generates. Only the model endpoint is fake."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from agent_lab.testing.fake_responses import FakeResponses
from agent_lab.testing.ports import EchoHostTools, allow_first, reject_first

from driver.adapters.codex.adapter import codex_binary
from driver.ports.mcp_host import McpHostServer
from driver.protocol.boot import HostTool, McpServer
from driver.protocol.commands import RunInput
from tests.adapters import wire
from tests.adapters.test_codex import ROOT, make
from tests.helpers import attachments as attachment_files

pytestmark = pytest.mark.provider


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeResponses]:
    with FakeResponses() as f:
        yield f


async def test_every_message_to_codex_matches_its_schema(
    tmp_path: Path, fake: FakeResponses, monkeypatch: pytest.MonkeyPatch
) -> None:
    schema = wire.codex_schema(codex_binary(ROOT), tmp_path / "schema")
    sent = wire.capture(monkeypatch)
    docs_tools = EchoHostTools()
    docs = McpHostServer([HostTool(name="search_docs", description="Search the docs")], docs_tools)
    await docs.start()
    h = make(
        tmp_path,
        fake.base_url,
        system_prompt="Be brief.",
        environment={"DOCS_AUTH": f"Bearer {docs.token}"},
        host_tools=[HostTool(name="lookup_order", description="Look up an order")],
        mcp_servers=[
            McpServer(name="docs", transport="http", url=docs.url, headers_from_env={"Authorization": "DOCS_AUTH"})
        ],
    )
    picture = attachment_files.place(h.cwd, "pic.png", attachment_files.png())
    await h.adapter.start()
    try:
        # First, so that the first message.delta is this turn's.
        async with anyio.create_task_group() as tg:

            async def slow() -> None:
                await h.adapter.run("run-slow", RunInput(text="[[slow]]"))

            tg.start_soon(slow)
            await h.events.wait_for("message.delta")
            await h.adapter.cancel()
        assert (await h.run("[[say:hello]]")).final_message_text == "hello"
        h.perms.decide = allow_first
        await h.run("[[shell:echo yes > allowed.txt]]", "run-allow")
        h.perms.decide = reject_first
        await h.run("[[shell:echo no > declined.txt]]", "run-decline")
        h.perms.decide = allow_first
        await h.run("[[write:notes.txt:patched]]", "run-patch")
        await h.run('[[mcp:docs:search_docs:{"q": "retry"}]]', "run-mcp")
        with anyio.fail_after(30):
            await h.adapter.run("run-image", RunInput(text="[[say:seen]]", attachments=[picture]))
        thread = h.adapter.native_id
    finally:
        await h.adapter.stop()
    again = make(tmp_path, fake.base_url, resume=thread)
    await again.adapter.start()
    try:
        assert again.adapter.native_id == thread
    finally:
        await again.adapter.stop()
        await docs.close()

    mine = [s for s in sent.sent if s.peer == "codex"]
    # The sessions covered what they were meant to (else this test would prove little).
    assert {"initialize", "thread/start", "thread/resume", "turn/start", "turn/interrupt"} <= {
        s.method for s in mine if s.kind == "request"
    }
    answered = {s.method for s in mine if s.kind == "response"}
    assert {"item/commandExecution/requestApproval", "item/fileChange/requestApproval"} <= answered
    assert "mcpServer/elicitation/request" in answered
    assert {s.body["result"]["decision"] for s in mine if s.method == "item/commandExecution/requestApproval"} == {
        "accept",
        "decline",
    }
    assert wire.problems((s, wire.codex_check(schema, s)) for s in mine) == []
    # The check has teeth: a misnamed field, which Codex would silently ignore, is caught.
    start = next(s for s in mine if s.method == "thread/start")
    params = {**start.body["params"], "developerInstruction": "typo"}
    assert wire.codex_check(schema, wire.Sent("codex", "request", "thread/start", {**start.body, "params": params}))
    answer = next(s for s in mine if s.method == "item/commandExecution/requestApproval")
    wrong = {**answer.body, "result": {"decision": "approve"}}
    assert wire.codex_check(schema, wire.Sent("codex", "response", answer.method, wrong))
