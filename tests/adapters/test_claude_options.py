"""Configuration of the Claude CLI from an execution snapshot (no CLI started)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from driver import containment
from driver.adapters import claude_options
from driver.adapters.claude_options import (
    LAUNCH_VAR,
    LAUNCHER,
    launch_command,
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


def test_launcher_drops_unlisted_variables_and_starts_a_new_session(tmp_path: Path) -> None:
    probe = tmp_path / "probe.sh"
    # Says what it got, then waits for stdin to close (so its group can be looked at from outside).
    probe.write_text('#!/bin/sh\necho "keep=$KEEP drop=$DROP launch=${AGENT_DRIVER_CLAUDE_LAUNCH:-}"\nread -r _ || :\n')
    probe.chmod(0o755)
    launch = launch_command(probe, keep=["KEEP", "PATH"], parent={"DROP": "value-of-drop", "KEEP": "y", "PATH": "p"})
    assert launch is not None  # setsid and env are installed here (util-linux, coreutils)
    launcher, launch_env = launch
    assert "value-of-drop" not in repr(launch_env)  # names only, never values
    assert containment.prefix()[0] in launch_env[LAUNCH_VAR]  # contained like every provider
    env = {"DROP": "leaked", "KEEP": "kept", "PATH": os.environ["PATH"], **launch_env}
    proc = subprocess.Popen([str(launcher)], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    out = proc.stdout.readline()
    # Its own process group, led by the process the SDK started (exec all the way, no fork).
    assert os.getpgid(proc.pid) == proc.pid != os.getpgrp()
    out_rest, _ = proc.communicate("", timeout=30)
    assert proc.returncode == 0 and out_rest == ""
    fields = dict(part.split("=", 1) for part in out.split())
    assert fields == {"keep": "kept", "drop": "", "launch": ""}


def test_the_launcher_is_a_fixed_file_of_the_package_never_written_at_run_time(tmp_path: Path) -> None:
    """Issue 20: the launcher used to be rewritten in the agent-writable state_dir before each start."""
    launch = launch_command(Path("/bin/true"), keep=[], parent={})
    assert launch is not None
    launcher, _ = launch
    assert launcher == LAUNCHER and launcher.parent == Path(claude_options.__file__).parent
    assert os.access(launcher, os.X_OK)
    before = launcher.read_bytes()
    from driver.adapters import claude_setup
    from driver.adapters.base import AdapterConfig
    from driver.protocol.boot import ExecutionConfig, SessionConfig

    state = tmp_path / "state" / "providers" / "claude-agent-sdk"
    config = AdapterConfig(
        session=SessionConfig(
            id="s", agent_id="a", kind="cattle", cwd=str(tmp_path), state_dir=str(tmp_path / "state")
        ),
        execution=ExecutionConfig(revision="r", runtime="claude-agent-sdk"),
        state_dir=state,
        project_root=tmp_path,
        traceparent=None,
        env={"PATH": os.environ["PATH"], "ANTHROPIC_API_KEY": "sk-ant-secret-value"},
    )
    options, _, used = claude_setup.client_options(
        config,
        None,
        resume=None,
        session_id="x",
        on_stderr=lambda _: None,
        can_use_tool=None,  # type: ignore[arg-type]
    )
    assert used and options.cli_path == str(LAUNCHER)
    assert "sk-ant-secret-value" not in options.env[LAUNCH_VAR]
    assert not list(tmp_path.rglob("*launcher*"))  # nothing written under the sandbox
    assert launcher.read_bytes() == before


def test_host_tool_schema_without_properties_stays_a_json_schema() -> None:
    from driver.adapters.claude_setup import sdk_schema

    assert sdk_schema({"type": "object"}) == {"type": "object", "properties": {}}
    full = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
    assert sdk_schema(full) is full


def test_an_install_without_the_executable_bit_runs_a_copy_from_the_driver_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wheel keeps no mode for a module: then one copy of the same fixed text goes to state_dir/driver/
    (hidden from the provider tree, refused by the ports), never to the provider's folder."""
    plain = tmp_path / "pkg" / "claude_launcher.py"
    plain.parent.mkdir()
    plain.write_bytes(LAUNCHER.read_bytes())
    plain.chmod(0o644)
    monkeypatch.setattr(claude_options, "LAUNCHER", plain)
    driver_dir = tmp_path / "state" / "driver"
    launch = launch_command(Path("/bin/echo"), keep=["PATH"], parent={}, driver_dir=driver_dir)
    assert launch is not None
    launcher, launch_env = launch
    assert launcher == driver_dir / "claude-launcher" and launcher.read_bytes() == plain.read_bytes()
    assert launcher.stat().st_mode & 0o777 == 0o500
    out = subprocess.run([str(launcher), "from", "the copy"], env={"PATH": os.environ["PATH"], **launch_env},
                         capture_output=True, text=True, timeout=30)  # fmt: skip
    assert out.stdout == "from the copy\n", out.stderr
    assert launch_command(Path("/bin/echo"), keep=[], parent={}, driver_dir=None) is None
