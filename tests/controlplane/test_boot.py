"""`agent-driver controlplane boot` mints payloads the driver accepts; `events --wait` long-polls."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from pathlib import Path

import pytest
from agent_lab.controlplane import ControlPlane
from agent_lab.controlplane.boot import main as boot_main
from agent_lab.controlplane.cli import main as cli_main

from driver.boot import read_boot_payload
from tests.controlplane.client import INSTANCE, TOKEN, batch, event, handshake, recv, send
from tests.controlplane.test_http_api import printed_json


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "cp.token"
    path.write_text(TOKEN + "\n")
    return path


def base_argv(cp: ControlPlane, token_file: Path, out: Path, runtime: str = "claude-agent-sdk") -> list[str]:
    return ["--runtime", runtime, "--instance", INSTANCE, "--out", str(out), "--url", str(cp.http_url),
            "--token-file", str(token_file), "--cwd", "/workspace", "--state-dir", "/workspace/.state"]  # fmt: skip


async def mint(argv: list[str]) -> int:
    return await asyncio.to_thread(boot_main, argv)


async def test_mints_a_0600_payload_the_driver_reads(
    cp: ControlPlane,
    token_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("SECRET_KEY_FOR_TEST", "sk-from-the-environment")
    out = tmp_path / "boot.json"
    argv = [
        *base_argv(cp, token_file, out, "acp"),
        "--env", "SECRET_KEY_FOR_TEST", "--env", "PLAIN=value=with=equals",
        "--acp-command", "codex-acp --flag 'two words'", "--acp-env", "CODEX_HOME=/workspace/.codex",
        "--provider-option", "mode=default", "--provider-option", 'config_options={"a": 1}',
        "--idle-exit-ms", "none", "--kind", "pet", "--memory-dir", "/memory", "--add-dir", "/data",
        "--model", "gpt-5.4", "--permission-policy", "full_access", "--traceparent", "00-abc-def-01",
        "--json", '{"execution": {"mcp_servers": [{"name": "docs", "transport": "http", "url": "http://x"}]}}',
        "--json", '{"session": {"agent_id": "agt-from-json"}}',
    ]  # fmt: skip
    assert await mint(argv) == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    err = capsys.readouterr().err
    assert TOKEN not in err and "sk-from-the-environment" not in err
    assert str(out) in err
    payload = read_boot_payload(str(out))  # the driver's own reader: checks mode and owner, then deletes
    assert not out.exists()
    assert payload.control.url == cp.url and payload.control.token == TOKEN
    assert payload.driver_instance_id == INSTANCE
    assert payload.session.kind == "pet" and payload.session.idle_exit_ms is None
    assert payload.session.agent_id == "agt-from-json" and payload.session.id == f"ses-{INSTANCE}"
    assert payload.session.memory_dir == "/memory" and payload.session.additional_directories == ["/data"]
    execution = payload.execution
    assert execution.environment == {"SECRET_KEY_FOR_TEST": "sk-from-the-environment", "PLAIN": "value=with=equals"}
    assert execution.acp is not None and execution.acp.command == ["codex-acp", "--flag", "two words"]
    assert execution.acp.env == {"CODEX_HOME": "/workspace/.codex"}
    assert execution.provider_options == {"mode": "default", "config_options": {"a": 1}}
    assert execution.model == "gpt-5.4" and execution.permission_policy == "full_access"
    assert [s.name for s in execution.mcp_servers] == ["docs"]
    assert payload.traceparent == "00-abc-def-01"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--env", "SURELY_UNSET_VARIABLE_X"], "SURELY_UNSET_VARIABLE_X is not set in this environment"),
        (["--cwd", "relative/dir"], "--cwd must be an absolute path"),
        (["--idle-exit-ms", "soon"], "--idle-exit-ms must be a number"),
        (["--json", "[1]"], "--json must be a JSON object"),
        (["--json", '{"execution": {"permission_timeout_ms": -1}}'], "execution.permission_timeout_ms"),
        (["--json", '{"session": {"colour": "red"}}'], "colour"),
        (["--owner", "agent"], "--owner must be UID or UID:GID"),
    ],
)
async def test_bad_requests_are_named_and_write_nothing(
    cp: ControlPlane,
    token_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    message: str,
) -> None:
    out = tmp_path / "boot.json"
    assert await mint([*base_argv(cp, token_file, out), *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and TOKEN not in err
    assert not out.exists()


async def test_acp_without_a_command_is_refused(
    cp: ControlPlane, token_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await mint(base_argv(cp, token_file, tmp_path / "boot.json", "acp")) == 2
    assert "execution.acp is required" in capsys.readouterr().err


async def test_refuses_to_overwrite_and_checks_token_and_instance(
    cp: ControlPlane, token_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "boot.json"
    out.write_text("in use")
    assert await mint(base_argv(cp, token_file, out)) == 2
    assert "exists" in capsys.readouterr().err
    assert out.read_text() == "in use"
    out.unlink()

    stranger = [*base_argv(cp, token_file, out)]
    stranger[stranger.index(INSTANCE)] = "drv-stranger"
    assert await mint(stranger) == 2
    assert "does not allow instance 'drv-stranger'" in capsys.readouterr().err

    bad = tmp_path / "bad.token"
    bad.write_text("not-the-token-at-all")
    assert await mint(base_argv(cp, bad, out)) == 2
    assert "refused the token" in capsys.readouterr().err
    assert not out.exists()


async def test_without_a_running_control_plane_it_says_so(
    token_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--runtime", "claude-agent-sdk", "--instance", INSTANCE, "--out", str(tmp_path / "b.json"),
            "--url", "http://127.0.0.1:9", "--token-file", str(token_file),
            "--cwd", "/w", "--state-dir", "/s"]  # fmt: skip
    assert await mint(argv) == 2
    assert "is the control plane running?" in capsys.readouterr().err
    # --cp-url needs no control plane at all (a payload minted ahead of time).
    assert await mint([*argv, "--cp-url", "wss://cp.example:8765/driver"]) == 0
    assert json.loads((tmp_path / "b.json").read_text())["control"]["url"] == "wss://cp.example:8765/driver"


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
async def test_owner_hands_the_file_to_the_drivers_uid(cp: ControlPlane, token_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "boot.json"
    assert await mint([*base_argv(cp, token_file, out), "--owner", "10001:10001"]) == 0
    st = out.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (10001, 10001, 0o600)


async def test_events_wait_returns_when_the_event_is_stored(
    cp: ControlPlane, token_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--url", str(cp.http_url), "--token-file", str(token_file), "--instance", INSTANCE]
    waiting = asyncio.create_task(
        asyncio.to_thread(cli_main, ["events", *base, "--kind", "run.started", "--wait", "20"])
    )
    ws, _ = await handshake(cp.url)
    await send(ws, batch(1, [event(1, "run.started", run_id="r1")]))
    assert (await recv(ws))["accepted"]
    assert await asyncio.wait_for(waiting, 20) == 0
    printed = printed_json(capsys.readouterr().out)
    assert [e["kind"] for e in printed["events"]] == ["run.started"]  # type: ignore[union-attr]
    await ws.close()


async def test_events_wait_times_out_with_status_1(
    cp: ControlPlane, token_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--url", str(cp.http_url), "--token-file", str(token_file), "--instance", INSTANCE]
    assert await asyncio.to_thread(cli_main, ["events", *base, "--kind", "run.failed", "--wait", "0.2"]) == 1
    assert "no matching event within 0.2 s" in capsys.readouterr().err


async def test_a_pending_long_poll_ends_when_the_control_plane_stops(cp: ControlPlane) -> None:
    from agent_lab.controlplane.http_api import HttpApi

    path = f"/api/instances/{INSTANCE}/events?kind=run.failed&wait_ms=600000"
    waiting = asyncio.create_task(HttpApi(cp).dispatch("GET", path, f"Bearer {TOKEN}", b""))
    await asyncio.sleep(0)  # one step: the request runs until it waits for a change
    assert not waiting.done()
    await asyncio.wait_for(cp.stop(), 20)
    assert await asyncio.wait_for(waiting, 5) == (200, {"events": [], "last_seq": None})
