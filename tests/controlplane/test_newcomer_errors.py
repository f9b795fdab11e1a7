"""The errors a newcomer meets first in the lab's commands (issue 35), run as the real commands: one line
on stderr, no traceback, the problem named, the next step said, a non-zero exit status."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_lab.controlplane import ControlPlane

from tests.controlplane.client import INSTANCE, TOKEN, http

ROOT = Path(__file__).resolve().parents[2]


def lab(*argv: str) -> list[str]:
    return [sys.executable, "-m", "driver.cli", *argv]


async def run(cmd: list[str], cwd: Path) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_DRIVER")}
    proc = await asyncio.create_subprocess_exec(
        *cmd, cwd=cwd, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


@pytest.fixture
def listening() -> Iterator[int]:
    """A loopback port something already listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("module", ["fake_anthropic", "fake_responses"])
async def test_a_fake_model_on_a_taken_port_says_so(tmp_path: Path, listening: int, module: str) -> None:
    cmd = [sys.executable, "-m", f"agent_lab.testing.{module}", "--port", str(listening)]
    status, _, err = await run(cmd, tmp_path)
    line = one_line(err)
    assert status != 0
    assert f"port {listening} on 127.0.0.1 is already in use" in line and "pass another --port" in line


@pytest.mark.parametrize("which", ["--port", "--http-port"])
async def test_a_second_control_plane_on_a_taken_port_says_which(tmp_path: Path, listening: int, which: str) -> None:
    ports = {"--port": str(free_port()), "--http-port": str(free_port()), which: str(listening)}
    flags = [a for kv in ports.items() for a in kv]
    cmd = lab("controlplane", "--db", "cp.sqlite3", "--token-file", "cp.token", *flags)
    status, _, err = await run(cmd, tmp_path)
    line = one_line(err)
    assert status == 1
    assert f"127.0.0.1:{listening} is already in use" in line and f"choose another {which}" in line
    assert not (tmp_path / "cp.token").exists()  # refused before anything was created


async def test_send_refuses_an_unknown_kind_before_sending(tmp_path: Path) -> None:
    (tmp_path / "cp.token").write_text(TOKEN)
    # No control plane at this URL: the refusal comes first, from the client itself.
    cmd = lab("controlplane", "send", "--url", f"http://127.0.0.1:{free_port()}", "--token-file", "cp.token",
              "--instance", INSTANCE, "--kind", "input.stat")  # fmt: skip
    status, out, err = await run(cmd, tmp_path)
    line = one_line(err)
    assert status == 2 and out == ""
    assert "unknown --kind 'input.stat'; did you mean input.start?" in line
    assert "known: input.start, input.steer" in line and "session.stop" in line


async def test_the_http_api_refuses_an_unknown_kind(cp: ControlPlane) -> None:
    assert cp.http_url is not None
    body = {"kind": "input.stat"}
    status, answer = await asyncio.to_thread(http, cp.http_url, "POST", f"/api/instances/{INSTANCE}/commands", body)
    assert status == 400
    assert answer["error"].startswith("unknown command kind 'input.stat' (known: input.start,")
    assert cp.store.commands(INSTANCE) == []  # nothing stored, nothing sent


async def test_send_prints_the_control_planes_refusal_and_exits_1(cp: ControlPlane, tmp_path: Path) -> None:
    assert cp.http_url is not None
    (tmp_path / "cp.token").write_text(TOKEN)
    cmd = lab("controlplane", "send", "--url", cp.http_url, "--token-file", "cp.token", "--instance", INSTANCE,
              "--kind", "session.stop", "--field", "seq=3")  # fmt: skip
    status, out, err = await run(cmd, tmp_path)
    assert status == 1 and json.loads(out) == {"error": "seq is assigned by the control plane"}
    assert one_line(err) == (
        "agent-driver controlplane send: the control plane refused it (HTTP 400): seq is assigned by the control plane"
    )


async def test_send_with_a_missing_token_file_is_one_line(tmp_path: Path) -> None:
    status, _, err = await run(
        lab("controlplane", "events", "--token-file", "nope.token", "--instance", INSTANCE), tmp_path
    )
    assert status == 2 and "cannot read --token-file nope.token" in one_line(err)


MINT = ("controlplane", "boot", "--runtime", "claude-agent-sdk", "--instance", INSTANCE, "--out", "boot.json",
        "--token-file", "cp.token", "--cwd", "/w", "--state-dir", "/w/.state")  # fmt: skip


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("http://127.0.0.1:8766", "the driver dials a WebSocket: give --cp-url the control plane's driver endpoint"),
        ("ws://cp.example:8765/driver", "a ws:// one to a loopback host, or add --insecure-transport"),
    ],
)
async def test_mint_refuses_a_control_url_the_driver_would_refuse(tmp_path: Path, url: str, said: str) -> None:
    (tmp_path / "cp.token").write_text(TOKEN)
    status, _, err = await run(lab(*MINT, "--cp-url", url), tmp_path)
    line = one_line(err)
    assert status == 2 and said in line and "the driver would refuse it" in line
    assert TOKEN not in err
    assert not (tmp_path / "boot.json").exists()


async def test_mint_writes_the_control_planes_ws_url(cp: ControlPlane, tmp_path: Path) -> None:
    assert cp.http_url is not None
    (tmp_path / "cp.token").write_text(TOKEN)
    status, _, err = await run(lab(*MINT, "--url", cp.http_url), tmp_path)
    assert status == 0, err
    url = json.loads((tmp_path / "boot.json").read_text())["control"]["url"]
    assert url == cp.url and url.startswith("ws://")
