"""The `openai-app-server` adapter against the REAL Codex binary (`codex app-server`), pointed at the
fake Responses endpoint, fully offline. Only the model endpoint is fake."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest
from agent_lab.testing.fake_responses import FakeResponses
from agent_lab.testing.ports import (
    EchoHostTools,
    RecordingEvents,
    ScriptedPermissions,
    allow_first,
    recording_ports,
    reject_first,
)
from agent_lab.testing.script import DEFAULT_TEXT

from driver.adapters.codex.adapter import CodexAdapter, codex_binary
from driver.adapters.common.base import AdapterConfig, PermissionDecision, PermissionRequest, ProviderError, TurnOutcome
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

ROOT = Path(__file__).resolve().parents[2]
API_KEY = "sk-fake-codex-test-key-0123456789"


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeResponses]:
    with FakeResponses() as f:
        yield f


class Harness:
    def __init__(self, adapter: CodexAdapter, events: RecordingEvents, perms: ScriptedPermissions, cwd: Path):
        self.adapter = adapter
        self.events = events
        self.perms = perms
        self.cwd = cwd

    async def run(self, text: str, run_id: str = "run-1", timeout: float = 30) -> TurnOutcome:
        with anyio.fail_after(timeout):
            return await self.adapter.run(run_id, RunInput(text=text))


def make(
    tmp_path: Path,
    base_url: str,
    *,
    policy: str = "supervised",
    resume: str | None = None,
    recovery: list[RecoveryMessage] | None = None,
    perms: ScriptedPermissions | None = None,
    state: str = "state",
    system_prompt: str = "",
    environment: dict[str, str] | None = None,
    host_tools: list[HostTool] | None = None,
    mcp_servers: list[McpServer] | None = None,
    skills: list[Skill] | None = None,
    memory_dir: str | None = None,
) -> Harness:
    cwd = tmp_path / "work"
    cwd.mkdir(exist_ok=True)
    state_dir = tmp_path / state
    execution = ExecutionConfig(
        revision="rev-1",
        runtime="openai-app-server",
        model="gpt-5.5",
        system_prompt=system_prompt,
        permission_policy=policy,  # type: ignore[arg-type]
        environment={"OPENAI_API_KEY": API_KEY, **(environment or {})},
        host_tools=host_tools or [],
        mcp_servers=mcp_servers or [],
        provider_options={"base_url": base_url, "env_key": "OPENAI_API_KEY"},
        native_resume=NativeResume(runtime="openai-app-server", value=resume) if resume else None,
        recovery_messages=recovery or [],
        skills=skills or [],
    )
    session = SessionConfig(
        id="ses-1", agent_id="agt-1", kind="pet", cwd=str(cwd), state_dir=str(state_dir), memory_dir=memory_dir
    )
    env = provider_env(execution.environment, home=str(state_dir / "home"))
    config = AdapterConfig(session=session, execution=execution, state_dir=state_dir, project_root=ROOT, env=env)
    ports, events, permissions = recording_ports(cwd, perms)
    return Harness(CodexAdapter(config, ports), events, permissions, cwd)


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def test_missing_binary_is_provider_missing(tmp_path: Path) -> None:
    with pytest.raises(ProviderError) as info:
        codex_binary(tmp_path)
    assert info.value.code == "provider.missing"
    assert "npm install" in info.value.message
    with pytest.raises(ProviderError):
        codex_binary(ROOT, machine="sparc")


@pytest.mark.provider
async def test_text_thought_usage_and_offline_config(tmp_path: Path, fake: FakeResponses) -> None:
    h = make(tmp_path, fake.base_url, system_prompt="Always answer like a pirate.")
    await h.adapter.start()
    try:
        thread_id = h.adapter.native_id
        assert thread_id and h.events.of("runtime.resume.updated") == [
            {"runtime": "openai-app-server", "value": thread_id}
        ]
        assert h.adapter.process_group_ids() and h.adapter.process_group_ids()[0] != os.getpgid(0)
        before = len(fake.requests)
        outcome = await h.run("[[think]] [[say:Hi there, driver]]")
        assert outcome.status == "completed", outcome
        assert outcome.final_message_text == "Hi there, driver"
        completed = h.events.of("message.completed")
        assert completed[-1]["text"] == "Hi there, driver"
        assert outcome.final_message_id == completed[-1]["message_id"]
        deltas = [e["text"] for e in h.events.of("message.delta")]
        assert "".join(deltas) == "Hi there, driver" and len(deltas) > 1
        assert h.events.of("thought.completed")[0]["text"] == "Let me think about this carefully."
        kinds = h.events.kinds()
        assert kinds.index("thought.started") < kinds.index("thought.completed") < kinds.index("message.completed")
        assert outcome.usage is not None and outcome.usage["output_tokens"] > 0
        assert h.events.of("usage.updated")[-1]["input_tokens"] == outcome.usage["input_tokens"]
        # The key reached the endpoint through the environment; it is on disk nowhere in CODEX_HOME's config.
        assert fake.request_headers[before]["authorization"] == f"Bearer {API_KEY}"
        config = (tmp_path / "state" / "codex-home" / "config.toml").read_text()
        assert API_KEY not in config and 'env_key = "OPENAI_API_KEY"' in config
        assert not fake.other_requests
        developer = [i for i in fake.requests[-1]["input"] if i.get("role") == "developer"]
        assert "Always answer like a pirate." in str(developer)
    finally:
        await h.adapter.stop()
    assert h.adapter.process_group_ids() == []


@pytest.mark.provider
async def test_command_approval_allowed_then_declined(tmp_path: Path, fake: FakeResponses) -> None:
    h = make(tmp_path, fake.base_url)
    await h.adapter.start()
    try:
        outcome = await h.run("[[shell:echo made-it && touch allowed.txt]]", "run-a")
        assert outcome.status == "completed" and outcome.final_message_text == "shell done"
        assert (h.cwd / "allowed.txt").exists()
        request = h.perms.requests[0]
        assert "touch allowed.txt" in request.title and request.tool_name == "shell"
        assert {o.kind for o in request.options} >= {"allow_once", "reject_once"}
        started = h.events.of("tool.started")[0]
        assert started["tool_call_id"] == request.tool_call_id and started["name"] == "shell"
        done = h.events.of("tool.completed")[0]
        assert (done["status"], done["exit_code"]) == ("completed", 0)
        # The whole output arbitrates (Codex may or may not stream a short output as deltas too).
        assert "made-it" in done["output"]

        h.perms.decide = reject_first
        outcome = await h.run("[[shell:touch declined.txt]]", "run-b")
        assert outcome.status == "completed"
        assert not (h.cwd / "declined.txt").exists()
        assert len(h.perms.requests) == 2
        declined = h.events.of("tool.completed")[1]
        assert declined["status"] == "declined"
        assert declined["tool_call_id"] == h.perms.requests[1].tool_call_id
    finally:
        await h.adapter.stop()


@pytest.mark.provider
async def test_file_change_approved_reports_file_changed(tmp_path: Path, fake: FakeResponses) -> None:
    h = make(tmp_path, fake.base_url, perms=ScriptedPermissions(allow_first))
    await h.adapter.start()
    try:
        outcome = await h.run("[[write:notes/hello.txt:hi from codex]]")
        assert outcome.status == "completed" and outcome.final_message_text == "write done"
        target = h.cwd / "notes" / "hello.txt"
        assert target.read_text() == "hi from codex\n"
        assert h.perms.requests and h.perms.requests[0].tool_name == "apply_patch"
        assert "notes/hello.txt" in h.perms.requests[0].title
        changed = h.events.of("file.changed")
        assert changed == [
            {"path": "notes/hello.txt", "change": "created", "sha256": hashlib.sha256(target.read_bytes()).hexdigest()}
        ]
        tool = h.events.of("tool.completed")[0]
        assert tool["status"] == "completed" and h.events.of("tool.started")[0]["name"] == "apply_patch"
    finally:
        await h.adapter.stop()


@pytest.mark.provider
async def test_a_file_change_outside_cwd_is_not_reported(tmp_path: Path, fake: FakeResponses) -> None:
    """The real Codex writes `../outside.txt` (approved): the driver neither hashes nor reports a file
    outside the allowed roots. Before issue 30's fix it reported `file.changed{path: "../outside.txt"}`."""
    h = make(tmp_path, fake.base_url, perms=ScriptedPermissions(allow_first))
    await h.adapter.start()
    try:
        outcome = await h.run("[[write:../outside.txt:from codex]]")
        assert outcome.status == "completed" and outcome.final_message_text == "write done", outcome
        assert (tmp_path / "outside.txt").read_text() == "from codex\n"  # Codex did write it
        assert h.events.of("tool.completed")[0]["status"] == "completed"
        assert h.events.of("file.changed") == []
    finally:
        await h.adapter.stop()


@pytest.mark.provider
async def test_host_tools_and_a_configured_mcp_server(tmp_path: Path, fake: FakeResponses) -> None:
    # A second instance of our MCP server stands in for a user's HTTP MCP server, reached with a header
    # whose value Codex takes from the environment.
    docs_tools = EchoHostTools()
    docs = McpHostServer([HostTool(name="search_docs", description="Search the docs")], docs_tools)
    await docs.start()
    h = make(
        tmp_path,
        fake.base_url,
        environment={"DOCS_AUTH": f"Bearer {docs.token}"},
        host_tools=[HostTool(name="lookup_order", description="Look up an order")],
        mcp_servers=[
            McpServer(name="docs", transport="http", url=docs.url, headers_from_env={"Authorization": "DOCS_AUTH"})
        ],
    )
    await h.adapter.start()
    try:
        outcome = await h.run('[[mcp:host:lookup_order:{"id": "42"}]]', "run-host")
        assert outcome.status == "completed" and "lookup_order ok" in outcome.final_message_text
        host_calls = h.adapter.ports.host_tools.calls  # type: ignore[attr-defined]
        assert host_calls == [("lookup_order", {"id": "42"})]
        assert h.perms.requests == []  # the control plane answers host tools itself
        started = h.events.of("tool.started")[0]
        assert started["name"] == "host.lookup_order"
        assert h.events.of("tool.completed")[0]["status"] == "completed"

        outcome = await h.run('[[mcp:docs:search_docs:{"q": "retry"}]]', "run-docs")
        assert outcome.status == "completed" and "search_docs ok" in outcome.final_message_text
        assert docs_tools.calls == [("search_docs", {"q": "retry"})]
        request = h.perms.requests[0]  # supervised: a configured server's tool needs a decision
        assert request.tool_name == "docs.search_docs" and request.tool_input == {"q": "retry"}
        assert request.tool_call_id == h.events.of("tool.started")[1]["tool_call_id"]
        config = (tmp_path / "state" / "codex-home" / "config.toml").read_text()
        assert docs.token not in config and h.adapter._host is not None and h.adapter._host.token not in config
    finally:
        await h.adapter.stop()
        await docs.close()


@pytest.mark.provider
async def test_full_access_runs_without_asking(tmp_path: Path, fake: FakeResponses) -> None:
    h = make(tmp_path, fake.base_url, policy="full_access")
    await h.adapter.start()
    try:
        outcome = await h.run("[[shell:echo free > free.txt]]")
        assert outcome.status == "completed"
        assert (h.cwd / "free.txt").read_text() == "free\n"
        assert h.perms.requests == []
    finally:
        await h.adapter.stop()


@pytest.mark.provider
@pytest.mark.serial  # interrupt to outcome within 5 s
async def test_interrupt_mid_stream_then_next_turn_works(tmp_path: Path, fake: FakeResponses) -> None:
    h = make(tmp_path, fake.base_url)
    await h.adapter.start()
    try:
        outcome: list[TurnOutcome] = []
        returned = anyio.Event()

        async def run_slow() -> None:
            outcome.append(await h.adapter.run("run-slow", RunInput(text="[[slow]]")))
            returned.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(run_slow)
            await h.events.wait_for("message.delta", timeout=30)
            asked = time.monotonic()
            with anyio.fail_after(5):
                await h.adapter.cancel()
                await returned.wait()
        assert outcome[0].status == "cancelled" and outcome[0].stop_reason == "cancelled"
        assert time.monotonic() - asked < 5
        # The slow reply lasts ~20 s; the turn ended long before its last word.
        assert "word399" not in "".join(e["text"] for e in h.events.of("message.delta"))
        after = await h.run("[[say:still here]]", "run-next")
        assert after.status == "completed" and after.final_message_text == "still here"
    finally:
        await h.adapter.stop()


@pytest.mark.provider
async def test_cancel_while_turn_start_is_in_flight(tmp_path: Path, fake: FakeResponses) -> None:
    h = make(tmp_path, fake.base_url)
    await h.adapter.start()
    try:
        outcome: list[TurnOutcome] = []
        began = time.monotonic()
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:

                async def run_slow() -> None:
                    outcome.append(await h.adapter.run("run-early", RunInput(text="[[slow]]")))

                tg.start_soon(run_slow)
                # One scheduling step: run() has sent turn/start and waits for its answer.
                await anyio.lowlevel.checkpoint()
                await h.adapter.cancel()
        assert outcome[0].status == "cancelled"
        assert time.monotonic() - began < 10  # the slow reply alone would take ~20 s
    finally:
        await h.adapter.stop()


@pytest.mark.provider
async def test_cancel_while_an_approval_is_pending(tmp_path: Path, fake: FakeResponses) -> None:
    h = make(tmp_path, fake.base_url, perms=ScriptedPermissions(hold=True))
    await h.adapter.start()
    try:
        outcome: list[TurnOutcome] = []
        with anyio.fail_after(15):
            async with anyio.create_task_group() as tg:

                async def run_shell() -> None:
                    outcome.append(await h.adapter.run("run-held", RunInput(text="[[shell:touch held.txt]]")))

                tg.start_soon(run_shell)
                await h.perms.pending.wait()
                # What the kernel does on turn.cancel: interrupt, and resolve pending requests cancelled.
                await h.adapter.cancel()
                h.perms.release(PermissionDecision("cancelled", None))
        assert outcome[0].status == "cancelled"
        assert not (h.cwd / "held.txt").exists()
        started = {e["tool_call_id"] for e in h.events.of("tool.started")}
        ended = {e["tool_call_id"]: e["status"] for e in h.events.of("tool.completed")}
        assert started and started == set(ended)
        assert set(ended.values()) <= {"cancelled", "declined"}
        after = await h.run("[[say:next]]", "run-next")
        assert after.status == "completed" and after.final_message_text == "next"
    finally:
        await h.adapter.stop()


@pytest.mark.provider
async def test_resume_in_a_new_adapter_and_bogus_id_resets(tmp_path: Path, fake: FakeResponses) -> None:
    first = make(tmp_path, fake.base_url)
    await first.adapter.start()
    try:
        assert (await first.run("[[say:the secret word is pelican]]")).status == "completed"
        thread_id = first.adapter.native_id
    finally:
        await first.adapter.stop()
    assert thread_id

    second = make(tmp_path, fake.base_url, resume=thread_id)
    await second.adapter.start()
    try:
        assert second.adapter.native_id == thread_id
        assert second.events.of("runtime.session.reset") == []
        assert second.events.of("runtime.resume.updated") == [{"runtime": "openai-app-server", "value": thread_id}]
        outcome = await second.run("what was the word?")
        assert outcome.status == "completed" and outcome.final_message_text == DEFAULT_TEXT
        # The resumed thread carried the earlier exchange to the model.
        assert "pelican" in str(fake.requests[-1]["input"])
    finally:
        await second.adapter.stop()

    bogus = "0199a0a0-0000-7000-8000-000000000000"
    recovery = [RecoveryMessage(role="user", text="remember swordfish"), RecoveryMessage(role="assistant", text="ok")]
    third = make(tmp_path, fake.base_url, resume=bogus, recovery=recovery, state="state-3")
    await third.adapter.start()
    try:
        current = third.adapter.native_id
        assert current and current != bogus
        assert third.events.of("runtime.session.reset") == [{"previous": bogus, "current": current}]
        assert (await third.run("[[say:replayed]]")).status == "completed"
        assert "remember swordfish" in str(fake.requests[-1]["input"])
        # Replayed once only.
        assert (await third.run("[[say:again]]", "run-2")).status == "completed"
        assert str(fake.requests[-1]["input"]).count("remember swordfish") == 1
    finally:
        await third.adapter.stop()


@pytest.mark.provider
async def test_endpoint_error_fails_quickly_with_message(tmp_path: Path, fake: FakeResponses) -> None:
    h = make(tmp_path, fake.base_url)
    await h.adapter.start()
    try:
        began = time.monotonic()
        outcome = await h.run("[[error]]", timeout=15)
        assert outcome.status == "failed"
        assert time.monotonic() - began < 5
        assert outcome.error_code == "provider.error"
        assert outcome.error_message and "internalServerError" in outcome.error_message
    finally:
        await h.adapter.stop()


@pytest.mark.provider
async def test_unreachable_endpoint_fails_within_10s(tmp_path: Path) -> None:
    h = make(tmp_path, closed_port_url())
    await h.adapter.start()
    try:
        began = time.monotonic()
        outcome = await h.run("hello", timeout=15)
        assert outcome.status == "failed", outcome
        assert time.monotonic() - began < 10
        assert outcome.error_message
    finally:
        await h.adapter.stop()


@pytest.mark.provider
async def test_codex_killed_mid_turn_is_provider_crashed_then_restarts(tmp_path: Path, fake: FakeResponses) -> None:
    h = make(tmp_path, fake.base_url)
    await h.adapter.start()
    try:
        failure: list[BaseException] = []

        async def run_slow() -> None:
            try:
                await h.adapter.run("run-crash", RunInput(text="[[slow]]"))
            except ProviderError as exc:
                failure.append(exc)

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(run_slow)
                await h.events.wait_for("message.delta")
                os.killpg(h.adapter.process_group_ids()[0], signal.SIGKILL)
                await h.adapter.wait_exited()
        assert isinstance(failure[0], ProviderError) and failure[0].code == "provider.crashed"
        assert "stderr_tail" in failure[0].details
        thread_id = h.adapter.native_id
        await h.adapter.stop()
        await h.adapter.start()
        # The restarted Codex resumes the same thread (its history is on disk under CODEX_HOME).
        assert h.adapter.native_id == thread_id and h.events.of("runtime.session.reset") == []
        assert (await h.run("[[say:back]]", "run-after")).final_message_text == "back"
    finally:
        await h.adapter.stop()


@pytest.mark.provider
async def test_instructions_and_skills_reach_the_model(tmp_path: Path, fake: FakeResponses) -> None:
    cwd = tmp_path / "work"
    cwd.mkdir()
    installed = await skill_archives.install_all(cwd, tmp_path / "archives")
    memory = tmp_path / "memory"
    memory.mkdir()
    h = make(
        tmp_path,
        fake.base_url,
        system_prompt="Always answer like a ship's cook.",
        skills=installed,
        memory_dir=str(memory),
    )
    await h.adapter.start()
    try:
        outcome = await h.run("[[say:aye]] instructions check")
        assert outcome.final_message_text == "aye"
        request = next(r for r in reversed(fake.requests) if "instructions check" in json.dumps(r))
        developer = json.dumps([i for i in request["input"] if i.get("role") == "developer"])
        assert "Always answer like a ship's cook." in developer
        assert "outputs/" in developer and str(memory) in developer
        # Codex lists the skills of CODEX_HOME/skills to the model, with the path of each SKILL.md.
        whole = json.dumps(request)
        for name, description in skill_archives.SKILLS:
            assert name in whole and description in whole, name
            assert f"/{name}/SKILL.md)" in whole  # a short path under an alias of the skills root
    finally:
        await h.adapter.stop()


@pytest.mark.provider
async def test_image_attachment_reaches_the_model(tmp_path: Path, fake: FakeResponses) -> None:
    h = make(tmp_path, fake.base_url)
    image = attachment_files.png()
    picture = attachment_files.place(h.cwd, "pic.png", image)
    notes = attachment_files.place(h.cwd, "notes.txt", b"plain words")
    await h.adapter.start()
    try:
        with anyio.fail_after(30):
            outcome = await h.adapter.run(
                "run-1", RunInput(text="[[say:seen]] look at this", attachments=[picture, notes])
            )
        assert outcome.final_message_text == "seen"
        request = next(r for r in reversed(fake.requests) if "look at this" in json.dumps(r))
        images = [c for i in request["input"] for c in (i.get("content") or []) if c.get("type") == "input_image"]
        assert len(images) == 1 and images[0]["image_url"].startswith("data:image/png;base64,")
    finally:
        await h.adapter.stop()


@pytest.mark.provider
async def test_an_approval_codex_withdraws_stops_waiting(tmp_path: Path, fake: FakeResponses) -> None:
    class Withdrawn(ScriptedPermissions):
        """Never decides; notes when the adapter stops waiting for it."""

        def __init__(self) -> None:
            super().__init__()
            self.withdrawn = anyio.Event()

        async def request(self, request: PermissionRequest) -> PermissionDecision:
            self.requests.append(request)
            self.pending.set()
            try:
                await anyio.sleep_forever()
            finally:
                self.withdrawn.set()
            raise AssertionError("unreachable")

    perms = Withdrawn()
    h = make(tmp_path, fake.base_url, perms=perms)
    await h.adapter.start()
    try:
        with anyio.fail_after(15):
            async with anyio.create_task_group() as tg:

                async def run_shell() -> None:
                    await h.adapter.run("run-held", RunInput(text="[[shell:touch held.txt]]"))

                tg.start_soon(run_shell)
                await perms.pending.wait()
                await h.adapter.cancel()  # nobody decides: Codex resolves the request itself (serverRequest/resolved)
                await perms.withdrawn.wait()
        assert not (h.cwd / "held.txt").exists()
    finally:
        await h.adapter.stop()
