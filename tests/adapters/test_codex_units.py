"""Codex pieces without the binary: config.toml rendering and the notification -> event mapping."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from agent_lab.testing.ports import recording_ports

from driver.adapters.codex import notices as codex_notices
from driver.adapters.codex import outcome as codex_outcome
from driver.adapters.codex import requests as codex_requests
from driver.adapters.codex import thread as codex_thread
from driver.adapters.codex.adapter import CodexAdapter
from driver.adapters.codex.config import CodexConfigError, render_config, settings_from, thread_policy
from driver.adapters.codex.turn import CodexTurn, FileTouched, TurnEnd
from driver.adapters.common.base import AdapterConfig, PermissionDecision, ProviderError
from driver.adapters.common.jsonrpc import METHOD_NOT_FOUND, JsonRpcError
from driver.protocol.boot import ExecutionConfig, McpServer, NativeResume, RecoveryMessage, SessionConfig
from driver.protocol.events import validate_payload


def _execution(**kw: object) -> ExecutionConfig:
    return ExecutionConfig(revision="r", runtime="openai-app-server", **kw)  # type: ignore[arg-type]


def test_config_is_offline_and_keeps_secrets_off_disk() -> None:
    execution = _execution(
        environment={"OPENAI_API_KEY": "sk-secret-value", "MCP_TOKEN": "Bearer abc", "DB_PASS": "hunter2"},
        provider_options={"base_url": "http://127.0.0.1:9/v1", "env_key": "OPENAI_API_KEY"},
        mcp_servers=[
            McpServer(
                name="docs", transport="http", url="http://mcp/", headers_from_env={"Authorization": "MCP_TOKEN"}
            ),
            McpServer(name="db tool", transport="stdio", command=["db-mcp", "--ro"], env={"DB_PASS": "hunter2"}),
        ],
    )
    text, extra_env = render_config(settings_from(execution), execution.mcp_servers)
    config = tomllib.loads(text)
    provider = config["model_providers"]["agent-driver"]
    assert config["model_provider"] == "agent-driver" and config["model"] == "gpt-5.5"
    assert provider["base_url"] == "http://127.0.0.1:9/v1" and provider["wire_api"] == "responses"
    assert provider["env_key"] == "OPENAI_API_KEY" and provider["request_max_retries"] == 0
    assert config["features"] == {"plugins": False, "unbounded_connection_retries": False, "shell_snapshot": False}
    assert config["analytics"] == {"enabled": False} and config["check_for_update_on_startup"] is False
    assert config["mcp_servers"]["docs"]["env_http_headers"] == {"Authorization": "MCP_TOKEN"}
    stdio = config["mcp_servers"]["db tool"]
    assert (stdio["command"], stdio["args"], stdio["env_vars"]) == ("db-mcp", ["--ro"], ["DB_PASS"])
    assert extra_env == {"DB_PASS": "hunter2"}
    for secret in ("sk-secret-value", "Bearer abc", "hunter2"):
        assert secret not in text


def test_policy_and_option_validation() -> None:
    assert thread_policy("full_access") == ("never", "danger-full-access")
    assert thread_policy("supervised") == ("untrusted", "workspace-write")
    assert settings_from(_execution(model="", provider_options={"model": "gpt-x"})).model == "gpt-x"
    with pytest.raises(CodexConfigError):
        settings_from(_execution(provider_options={"base_url": "ftp://x"}))
    with pytest.raises(CodexConfigError):
        settings_from(_execution(provider_options={"request_max_retries": -1}))
    without = tomllib.loads(render_config(settings_from(_execution()))[0])
    assert "model_provider" not in without and "model_providers" not in without


def test_decisions() -> None:
    item = "item/commandExecution/requestApproval"

    def decide(method: str, decision: PermissionDecision, params: dict[str, object] | None = None) -> object:
        return codex_requests.answer(method, params or {}, decision)

    assert decide(item, PermissionDecision("allowed", "accept", "allow_once")) == {"decision": "accept"}
    always = PermissionDecision("allowed", "acceptForSession", "allow_always")
    assert decide(item, always) == {"decision": "acceptForSession"}
    assert decide(item, PermissionDecision("rejected", "decline", "reject_once")) == {"decision": "decline"}
    assert decide(item, PermissionDecision("timed_out", None)) == {"decision": "decline"}
    assert decide(item, PermissionDecision("cancelled", None)) == {"decision": "cancel"}
    # Extra sandbox permissions: granted as asked, for the turn or the session; refused = nothing.
    asked = {"permissions": {"network": {"enabled": True}}}
    perms = "item/permissions/requestApproval"
    once = PermissionDecision("allowed", "accept", "allow_once")
    assert decide(perms, once, asked) == {"permissions": {"network": {"enabled": True}}, "scope": "turn"}
    assert decide(perms, always, asked)["scope"] == "session"  # type: ignore[index]
    assert decide(perms, PermissionDecision("rejected", "decline", "reject_once"), asked) == {
        "permissions": {},
        "scope": "turn",
    }
    # The v1 approvals still in the schema.
    assert decide("execCommandApproval", always) == {"decision": "approved_for_session"}
    assert decide("applyPatchApproval", PermissionDecision("rejected", None)) == {"decision": "denied"}
    assert decide("applyPatchApproval", PermissionDecision("cancelled", None)) == {"decision": "abort"}
    request = codex_requests.permission_request(
        perms, {"itemId": "i1", "reason": "needs network", **asked}, lambda _: []
    )
    assert request.tool_call_id == "i1" and "needs network" in request.title
    assert {o.kind for o in request.options} == {"allow_once", "allow_always", "reject_once"}
    v1 = codex_requests.permission_request("execCommandApproval", {"callId": "c", "command": ["ls", "-l"]}, list)
    assert v1.title == "Run: ls -l" and v1.tool_call_id == "c"


def _emitted(turn: CodexTurn, method: str, params: dict[str, object]) -> list[object]:
    out = turn.handle(method, {"threadId": "th", "turnId": "tu", **params})
    for item in out:
        if not isinstance(item, FileTouched):
            validate_payload(*item)  # every payload speaks our schema
    return out


def test_turn_mapping_files_plan_and_open_tools() -> None:
    turn = CodexTurn("run-1", "/w", "th", turn_id="tu")
    assert not turn.concerns({"threadId": "other", "turnId": "tu"})
    assert not turn.concerns({"threadId": "th", "turnId": "older"})
    change = {
        "type": "fileChange",
        "id": "fc1",
        "status": "completed",
        "changes": [
            {"path": "/w/a.txt", "kind": {"type": "add"}, "diff": ""},
            {"path": "/w/old.txt", "kind": {"type": "update", "move_path": "/w/new.txt"}, "diff": ""},
            {"path": "/w/gone.txt", "kind": {"type": "delete"}, "diff": ""},
        ],
    }
    out = _emitted(turn, "item/completed", {"item": change})
    assert [o[0] for o in out if isinstance(o, tuple)] == ["tool.started", "tool.completed"]
    files = [(f.relpath, f.change) for f in out if isinstance(f, FileTouched)]
    assert files == [("a.txt", "created"), ("old.txt", "deleted"), ("new.txt", "created"), ("gone.txt", "deleted")]

    diff = (
        "diff --git a/n.txt b/n.txt\nnew file mode 100644\n--- /dev/null\n+++ b/n.txt\n@@ -0,0 +1 @@\n+x\n"
        "diff --git a/m.txt b/m.txt\n--- a/m.txt\n+++ b/m.txt\n@@ -1 +1 @@\n-a\n+b\n"
        "diff --git a/d.txt b/d.txt\ndeleted file mode 100644\n--- a/d.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n"
        "diff --git a/r1.txt b/r2.txt\n--- a/r1.txt\n+++ b/r2.txt\n"
    )
    touched = _emitted(turn, "turn/diff/updated", {"diff": diff})
    assert [(f.relpath, f.change) for f in touched if isinstance(f, FileTouched)] == [
        ("n.txt", "created"),
        ("m.txt", "modified"),
        ("d.txt", "deleted"),
        ("r1.txt", "deleted"),
        ("r2.txt", "created"),
    ]

    plan = _emitted(turn, "turn/plan/updated", {"plan": [{"step": "a", "status": "inProgress"}]})
    assert plan == [("plan.updated", {"entries": [{"content": "a", "status": "in_progress"}]})]

    command = {"type": "commandExecution", "id": "c1", "command": "sleep 9", "cwd": "/w", "status": "inProgress"}
    _emitted(turn, "item/started", {"item": command})
    _emitted(turn, "item/commandExecution/outputDelta", {"itemId": "c1", "delta": "partial"})
    failed = {**command, "id": "c2", "status": "completed", "exitCode": 2, "aggregatedOutput": "boom"}
    assert _emitted(turn, "item/completed", {"item": failed})[-1] == (
        "tool.completed",
        {"tool_call_id": "c2", "status": "failed", "output": "boom", "exit_code": 2},
    )
    usage = {"last": {"inputTokens": 5, "outputTokens": 2, "cachedInputTokens": 1, "reasoningOutputTokens": 0}}
    _emitted(turn, "thread/tokenUsage/updated", {"tokenUsage": usage})
    _emitted(turn, "thread/tokenUsage/updated", {"tokenUsage": usage})
    assert turn.usage["input_tokens"] == 10
    _emitted(turn, "error", {"error": {"message": "bad gateway", "codexErrorInfo": "other"}, "willRetry": False})
    closing = _emitted(turn, "turn/completed", {"turn": {"id": "tu", "status": "interrupted", "items": []}})
    # The still-running command is ended for the client, with the output it had streamed.
    assert closing == [
        ("tool.completed", {"tool_call_id": "c1", "status": "cancelled", "output": "partial", "exit_code": None})
    ]
    assert turn.end is not None and turn.end.status == "interrupted"
    assert turn.end.error_message == "other: bad gateway"


def test_final_message_from_item_completed_and_late_deltas_ignored() -> None:
    turn = CodexTurn("run-1", "/w", "th", turn_id="tu")
    first = _emitted(turn, "item/agentMessage/delta", {"itemId": "m1", "delta": "Hel"})
    assert [o[0] for o in first if isinstance(o, tuple)] == ["message.started", "message.delta"]
    _emitted(turn, "item/completed", {"item": {"type": "agentMessage", "id": "m1", "text": "Hello"}})
    assert _emitted(turn, "item/agentMessage/delta", {"itemId": "m1", "delta": "late"}) == []
    _emitted(turn, "item/completed", {"item": {"type": "agentMessage", "id": "m2", "text": "Final"}})
    _emitted(turn, "turn/completed", {"turn": {"id": "tu", "status": "completed", "items": []}})
    assert (turn.final_message_id, turn.final_message_text) == ("m2", "Final")


def test_host_server_table_and_full_access_approves_mcp_tools() -> None:
    docs = McpServer(name="docs", transport="http", url="http://mcp/")
    execution = _execution(
        permission_policy="full_access",
        mcp_servers=[docs, McpServer(name="host", transport="http", url="http://evil/")],
    )
    config = tomllib.loads(render_config(settings_from(execution), execution.mcp_servers, "http://127.0.0.1:5/mcp")[0])
    host = config["mcp_servers"]["host"]
    assert host["url"] == "http://127.0.0.1:5/mcp"  # ours, not the configured server of the same name
    assert host["bearer_token_env_var"] == "AGENT_DRIVER_HOST_MCP_TOKEN"
    assert host["default_tools_approval_mode"] == "approve"
    assert config["mcp_servers"]["docs"]["default_tools_approval_mode"] == "approve"
    supervised = _execution(mcp_servers=[docs])
    config = tomllib.loads(render_config(settings_from(supervised), supervised.mcp_servers)[0])
    assert "default_tools_approval_mode" not in config["mcp_servers"]["docs"]


async def test_unknown_server_requests_are_refused(tmp_path: Path) -> None:
    session = SessionConfig(id="s", agent_id="a", kind="cattle", cwd=str(tmp_path), state_dir=str(tmp_path))
    config = AdapterConfig(session=session, execution=_execution(), state_dir=tmp_path, project_root=tmp_path)
    ports, _, perms = recording_ports(tmp_path)
    adapter = CodexAdapter(config, ports)
    for method in ("item/tool/requestUserInput", "account/chatgptAuthTokens/refresh", "attestation/generate"):
        with pytest.raises(JsonRpcError) as info:
            await adapter._on_request(method, {"threadId": "t"})
        assert info.value.code == METHOD_NOT_FOUND
    # A server's own elicitation (not a tool approval) is declined without asking anyone.
    answer = await adapter._on_request("mcpServer/elicitation/request", {"serverName": "docs", "_meta": {}})
    assert answer == {"action": "decline"} and perms.requests == []
    # Every approval request goes through the permission port, the legacy v1 ones too.
    answer = await adapter._on_request("applyPatchApproval", {"callId": "c1", "fileChanges": {"a.txt": {}}})
    assert answer == {"decision": "approved"} and perms.requests[-1].title == "Edit a.txt"


def test_session_notices_become_diagnostics() -> None:
    assert codex_notices.diagnostic("configWarning", {"summary": "bad key", "details": "line 3"}) == {
        "code": "provider.config",
        "severity": "warning",
        "message": "bad key (line 3)",
        "details": {"codex_method": "configWarning"},
    }
    failed = {"name": "docs", "status": "failed", "error": "connection refused"}
    notice = codex_notices.diagnostic("mcpServer/startupStatus/updated", failed)
    assert notice is not None and notice["message"] == "mcp server 'docs' failed to start: connection refused"
    assert codex_notices.diagnostic("mcpServer/startupStatus/updated", {"name": "docs", "status": "ready"}) is None
    rerouted = {"fromModel": "a", "toModel": "b", "reason": "highRiskCyberActivity"}
    assert "from a to b" in (codex_notices.diagnostic("model/rerouted", rerouted) or {})["message"]
    for method in codex_notices.NOTICES:
        payload = codex_notices.diagnostic(method, {"message": "m", "summary": "s", "name": "n", "status": "failed"})
        assert payload is not None
        validate_payload("diagnostic.reported", payload)


def test_mcp_progress_is_tool_output() -> None:
    turn = CodexTurn("run", "/w", "th")
    call = {"type": "mcpToolCall", "id": "m1", "server": "docs", "tool": "search", "status": "inProgress"}
    _emitted(turn, "item/started", {"item": call})
    assert _emitted(turn, "item/mcpToolCall/progress", {"itemId": "m1", "message": "50%"}) == [
        ("tool.output.delta", {"tool_call_id": "m1", "text": "50%\n"})
    ]


def test_a_message_codex_drops_for_a_steer_is_completed_with_what_was_streamed() -> None:
    from driver.adapters.codex.turn import CodexTurn

    turn = CodexTurn("run-1", "/tmp", "thr-1")
    turn.handle("item/started", {"item": {"id": "m1", "type": "agentMessage"}})
    turn.handle("item/agentMessage/delta", {"itemId": "m1", "delta": "half an "})
    turn.handle("item/agentMessage/delta", {"itemId": "m1", "delta": "answer"})
    # The steered request's response: a new message, the first one never completed by Codex.
    out = turn.handle("item/started", {"item": {"id": "m2", "type": "agentMessage"}})
    assert out == [
        ("message.completed", {"message_id": "m1", "role": "assistant", "text": "half an answer"}),
        ("message.started", {"message_id": "m2", "role": "assistant"}),
    ]
    turn.handle("item/completed", {"item": {"id": "m2", "type": "agentMessage", "text": "steered"}})
    end = turn.handle("turn/completed", {"turn": {"id": "t1", "status": "completed"}})
    assert end == []
    assert (turn.final_message_id, turn.final_message_text) == ("m2", "steered")


def test_which_thread_opens_own_then_boot_then_new_and_never_a_foreign_one() -> None:
    boot = NativeResume(runtime="openai-app-server", value="thr-boot")
    assert codex_thread.opening("thr-own", boot) == codex_thread.Opening("thr-own")  # ours first, no replay kept
    assert codex_thread.opening(None, boot) == codex_thread.Opening("thr-boot", recovery=True)
    assert codex_thread.opening(None, None) == codex_thread.Opening(None)
    foreign = NativeResume(runtime="claude-agent-sdk", value="sess-1")
    assert codex_thread.opening(None, foreign) == codex_thread.Opening(None, foreign=foreign)
    with pytest.raises(ProviderError, match="without a thread id"):
        codex_thread.thread_of({"thread": {}})
    assert codex_thread.thread_of({"thread": {"id": "thr-1"}}) == "thr-1"


def test_recovery_context_goes_before_the_next_turns_text_only_when_pending() -> None:
    said = [RecoveryMessage(role="user", text="hi"), RecoveryMessage(role="assistant", text="yo")]
    pending = codex_thread.recovery_of(said)
    assert codex_thread.with_recovery("next", []) == "next"
    text = codex_thread.with_recovery("next", pending)
    assert text.endswith("user: hi\nassistant: yo\n\nnext") and text.startswith("Context:")


def test_turn_outcomes_a_cancel_wins_over_anything_but_completed() -> None:
    turn = CodexTurn("run-1", "/w", "thr-1")
    turn.end = TurnEnd("failed", "boom", {"code": "x"})
    failed = codex_outcome.turn_outcome(turn, cancel_requested=False)
    assert (failed.status, failed.error_message) == ("failed", "boom")
    assert failed.error_details == {"codex_error": {"code": "x"}}
    assert codex_outcome.turn_outcome(turn, cancel_requested=True).status == "cancelled"
    turn.end = TurnEnd("completed", None)
    assert codex_outcome.turn_outcome(turn, cancel_requested=True).status == "completed"
    turn.end = TurnEnd("interrupted", None)
    assert codex_outcome.turn_outcome(turn, cancel_requested=False).stop_reason == "cancelled"
    refused = codex_outcome.refused_outcome(JsonRpcError(-32600, "busy"), cancel_requested=False)
    assert (refused.status, refused.error_message, refused.error_details) == (
        "failed",
        "codex refused turn/start: busy",
        {"code": -32600},
    )


def test_file_changes_outside_the_allowed_roots_are_dropped(tmp_path: Path) -> None:
    """A path Codex names in a `fileChange` item or the turn's diff is the agent's word: admitted through
    the files port, one outside cwd and the other roots (`../`, absolute, through a planted link, the
    driver's own state) is neither hashed nor reported. Before issue 30's fix every one was joined to
    cwd and reported (`../outside/x.txt` in `file.changed`)."""
    from driver.ports.files import AllowedRoots, driver_private

    cwd, memory, outside, state = (tmp_path / n for n in ("cwd", "memory", "outside", "state"))
    for d in (cwd, memory, outside, state / "driver"):
        d.mkdir(parents=True)
    (cwd / "escape").symlink_to(outside)
    files = AllowedRoots(cwd, [memory], private=driver_private(state))
    turn = CodexTurn("run-1", str(cwd), "th", turn_id="tu", admit=files.admit)
    change = {
        "type": "fileChange",
        "id": "fc1",
        "status": "completed",
        "changes": [
            {"path": "in.txt", "kind": {"type": "add"}, "diff": ""},
            {"path": "../outside/x.txt", "kind": {"type": "add"}, "diff": ""},
            {"path": str(outside / "y.txt"), "kind": {"type": "update"}, "diff": ""},
            {"path": "escape/z.txt", "kind": {"type": "add"}, "diff": ""},
            {"path": str(state / "driver" / "journal.db"), "kind": {"type": "update"}, "diff": ""},
            {"path": str(memory / "m.txt"), "kind": {"type": "add"}, "diff": ""},
            {"path": "old.txt", "kind": {"type": "update", "move_path": "../outside/moved.txt"}, "diff": ""},
        ],
    }
    out = _emitted(turn, "item/completed", {"item": change})
    touched = [(f.path, f.relpath, f.change) for f in out if isinstance(f, FileTouched)]
    real_cwd, real_memory = cwd.resolve(), memory.resolve()
    assert touched == [
        (str(real_cwd / "in.txt"), "in.txt", "created"),
        (str(real_memory / "m.txt"), str(real_memory / "m.txt"), "created"),
        (str(real_cwd / "old.txt"), "old.txt", "deleted"),
    ]
    diff = (
        "diff --git a/../outside/d.txt b/../outside/d.txt\n--- /dev/null\n+++ b/../outside/d.txt\n"
        "diff --git a/k.txt b/k.txt\n--- a/k.txt\n+++ b/k.txt\n"
        "diff --git a/escape/e.txt b/escape/e.txt\n--- a/escape/e.txt\n+++ /dev/null\n"
    )
    from_diff = _emitted(turn, "turn/diff/updated", {"diff": diff})
    assert [(f.relpath, f.change) for f in from_diff if isinstance(f, FileTouched)] == [("k.txt", "modified")]

    # Without the port (the default), a path is kept only when it is lexically inside cwd.
    lexical = CodexTurn("run-1", "/w", "th", turn_id="tu")
    out = _emitted(lexical, "item/completed", {"item": {**change, "changes": change["changes"][:3]}})
    assert [(f.path, f.relpath) for f in out if isinstance(f, FileTouched)] == [("/w/in.txt", "in.txt")]
