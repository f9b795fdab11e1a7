"""Configuration of the Claude CLI from an execution snapshot (no CLI started)."""

from __future__ import annotations

from pathlib import Path

from driver.adapters.claude.options import (
    mcp_servers,
    mcp_stdio_environment,
    provider_environment,
    recovery_preamble,
    system_prompt,
)
from driver.protocol.boot import ExecutionConfig, McpServer, RecoveryMessage


def test_environment_keeps_state_local_and_offline(tmp_path: Path) -> None:
    env = provider_environment({"PATH": "/bin", "CLAUDE_CODE_MAX_RETRIES": "3"}, tmp_path)
    assert env["CLAUDE_CONFIG_DIR"] == str(tmp_path / "claude-config")
    assert env["HOME"] == str(tmp_path / "home")
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert env["CLAUDE_CODE_MAX_RETRIES"] == "3"  # the execution's choice wins
    assert env["PATH"] == "/bin"


def test_mcp_servers_take_header_values_from_the_environment() -> None:
    servers = [
        McpServer(
            name="docs", transport="http", url="https://mcp.example/x", headers_from_env={"Authorization": "TOK"}
        ),
        McpServer(name="local", transport="stdio", command=["node", "srv.js", "--flag"], env={"A": "1"}),
        McpServer(name="broken", transport="http", url="https://b", headers_from_env={"X-Key": "MISSING"}),
    ]
    native, problems = mcp_servers(servers, {"TOK": "Bearer s3cret"})
    assert native["docs"] == {
        "type": "http",
        "url": "https://mcp.example/x",
        "headers": {"Authorization": "${TOK}"},  # a reference the CLI expands: never the value in argv
    }
    (var,) = mcp_stdio_environment(servers)
    assert mcp_stdio_environment(servers) == {var: "1"}
    assert native["local"] == {
        "type": "stdio",
        "command": "node",
        "args": ["srv.js", "--flag"],
        "env": {"A": "${" + var + "}"},
    }
    assert "s3cret" not in str(native)
    assert native["broken"] == {"type": "http", "url": "https://b"}
    assert len(problems) == 1 and "MISSING" in problems[0] and "s3cret" not in problems[0]


def test_empty_system_prompt_means_the_claude_code_preset() -> None:
    assert system_prompt(ExecutionConfig(revision="r", runtime="claude-agent-sdk")) == {
        "type": "preset",
        "preset": "claude_code",
    }
    custom = ExecutionConfig(revision="r", runtime="claude-agent-sdk", system_prompt="Be brief.")
    assert system_prompt(custom) == "Be brief."


def test_recovery_preamble_lists_the_history_in_order() -> None:
    text = recovery_preamble([RecoveryMessage(role="user", text="a"), RecoveryMessage(role="assistant", text="b")])
    assert text.index("[user]: a") < text.index("[assistant]: b")
    assert recovery_preamble([]) == ""
