"""The local HTTP JSON API and the CLI client built on it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from agent_lab.controlplane import ControlPlane
from agent_lab.controlplane.cli import main as cli_main

from tests.controlplane.client import (
    INSTANCE,
    OPERATOR_TOKEN,
    OTHER_TOKEN,
    TOKEN,
    batch,
    close_code,
    event,
    handshake,
    http,
    recv,
    send,
)


async def call(cp: ControlPlane, method: str, path: str, body: object = None, token: str | None = TOKEN):  # type: ignore[no-untyped-def]
    assert cp.http_url is not None
    return await asyncio.to_thread(http, cp.http_url, method, path, body, token)  # type: ignore[arg-type]


async def test_health_needs_no_token(cp: ControlPlane) -> None:
    assert await call(cp, "GET", "/api/health", token=None) == (200, {"ok": True})


async def test_api_requires_the_bearer_token(cp: ControlPlane) -> None:
    status, body = await call(cp, "GET", f"/api/instances/{INSTANCE}/events", token=None)
    assert status == 401
    status, _ = await call(cp, "GET", f"/api/instances/{INSTANCE}/events", token="nope-nope-nope")
    assert status == 401
    status, _ = await call(cp, "GET", "/api/faults", token="nope-nope-nope")
    assert status == 401
    assert "nope" not in json.dumps(body)


async def test_api_refuses_instances_outside_the_token(cp: ControlPlane) -> None:
    status, _ = await call(cp, "POST", "/api/instances/drv-stranger/commands", {"kind": "session.reset"})
    assert status == 403
    assert cp.commands("drv-stranger") == []
    status, _ = await call(cp, "GET", "/api/instances/drv-stranger/events", token=OTHER_TOKEN)
    assert status == 200


async def test_post_command_reaches_the_connected_driver(cp: ControlPlane) -> None:
    ws, _ = await handshake(cp.url)
    status, body = await call(
        cp,
        "POST",
        f"/api/instances/{INSTANCE}/commands",
        {"kind": "input.start", "run_id": "r1", "input": {"text": "hi"}},
    )
    assert status == 201
    assert body["seq"] == 1 and body["sent"] is True
    frame = await recv(ws)
    assert (frame["command_id"], frame["kind"], frame["input"]) == (body["command_id"], "input.start", {"text": "hi"})
    status, listed = await call(cp, "GET", f"/api/instances/{INSTANCE}/commands")
    assert status == 200
    assert [(c["command_id"], c["status"]) for c in listed["commands"]] == [(body["command_id"], "pending")]
    await ws.close()


async def test_post_command_validation(cp: ControlPlane) -> None:
    path = f"/api/instances/{INSTANCE}/commands"
    assert (await call(cp, "POST", path, {"run_id": "r"}))[0] == 400
    assert (await call(cp, "POST", path, {"kind": "session.reset", "seq": 9}))[0] == 400
    assert (await call(cp, "POST", path, {"kind": "session.reset", "command_id": "c-1"}))[0] == 201
    assert (await call(cp, "POST", path, {"kind": "session.reset", "command_id": "c-1"}))[0] == 409


async def test_get_events_after_seq(cp: ControlPlane) -> None:
    ws, _ = await handshake(cp.url)
    await send(ws, batch(1, [event(1), event(2, "message.delta"), event(3, "message.completed")]))
    await recv(ws)
    status, body = await call(cp, "GET", f"/api/instances/{INSTANCE}/events?after_seq=1")
    assert status == 200
    assert [e["seq"] for e in body["events"]] == [2, 3]
    assert body["last_seq"] == 3
    status, body = await call(cp, "GET", f"/api/instances/{INSTANCE}/events?kind=message.completed")
    assert [e["kind"] for e in body["events"]] == ["message.completed"]
    status, info = await call(cp, "GET", f"/api/instances/{INSTANCE}")
    assert (info["connected"], info["highest_epoch"], info["events_stored"]) == (True, 1, 3)
    await ws.close()


async def test_terminate_and_close_over_http(cp: ControlPlane) -> None:
    ws, _ = await handshake(cp.url)
    assert (await call(cp, "POST", f"/api/instances/{INSTANCE}/close", {"code": 1005}))[0] == 400
    assert await call(cp, "POST", f"/api/instances/{INSTANCE}/close", {"code": 1013}) == (200, {"closed": True})
    assert await close_code(ws) == 1013
    await cp.wait_disconnected(INSTANCE)
    ws, _ = await handshake(cp.url)
    assert (await call(cp, "POST", f"/api/instances/{INSTANCE}/terminate"))[0] == 200
    assert await close_code(ws) == 4410


async def test_malformed_http_is_answered_400(cp: ControlPlane) -> None:
    assert cp.http_port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", cp.http_port)
    writer.write(b"NONSENSE\r\n\r\n")
    await writer.drain()
    head = await asyncio.wait_for(reader.read(), timeout=5)
    writer.close()
    assert head.startswith(b"HTTP/1.1 400")


# -- CLI client -----------------------------------------------------------------------------------


def printed_json(out: str) -> dict[str, object]:
    """The CLI's JSON answer among the server's own log lines (both on this test's stdout)."""
    value, _ = json.JSONDecoder().raw_decode(out[out.index("{\n") :])
    assert isinstance(value, dict)
    return value


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    return path


async def test_cli_send_input_start(cp: ControlPlane, token_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ws, _ = await handshake(cp.url)
    argv = ["send", "--url", str(cp.http_url), "--token-file", str(token_file), "--instance", INSTANCE,
            "--kind", "input.start", "--text", "fix it", "--field", "extra=[1, 2]"]  # fmt: skip
    assert await asyncio.to_thread(cli_main, argv) == 0
    frame = await recv(ws)
    assert frame["kind"] == "input.start"
    assert frame["input"] == {"text": "fix it", "attachments": []}
    assert frame["run_id"].startswith("run-")
    assert frame["extra"] == [1, 2]
    printed = printed_json(capsys.readouterr().out)
    assert printed["command_id"] == frame["command_id"]
    await ws.close()


async def test_cli_faults_and_events(cp: ControlPlane, token_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--url", str(cp.http_url), "--token-file", str(token_file)]
    assert await asyncio.to_thread(cli_main, ["faults", *base, "--set", "receipt_delay_ms=250"]) == 1  # a driver's
    assert cp.faults.receipt_delay_ms == 0
    operator = token_file.with_name("operator.token")
    operator.write_text(OPERATOR_TOKEN + "\n")
    op = ["--url", str(cp.http_url), "--token-file", str(operator)]
    assert await asyncio.to_thread(cli_main, ["faults", *op, "--set", "receipt_delay_ms=250"]) == 0
    assert cp.faults.receipt_delay_ms == 250
    assert await asyncio.to_thread(cli_main, ["faults", *op, "--set", "bogus=1"]) == 1
    capsys.readouterr()
    assert await asyncio.to_thread(cli_main, ["events", *base, "--instance", INSTANCE]) == 0
    assert printed_json(capsys.readouterr().out)["events"] == []


async def test_cli_serve_runs_and_stops_on_sigterm(tmp_path: Path) -> None:
    import socket
    import sys

    def free_port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    ws_port, http_port = free_port(), free_port()
    token_path = tmp_path / "cp.token"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import sys; from agent_lab.controlplane.cli import main; sys.exit(main(sys.argv[1:]))",
        "--db", str(tmp_path / "cp.db"), "--token-file", str(token_path), "--port", str(ws_port),
        "--http-port", str(http_port), "--instance", INSTANCE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    try:
        async with asyncio.timeout(20):
            while b"control plane: ws://" not in (line := await proc.stderr.readline()):
                assert line, "control plane exited early"
        token = token_path.read_text().strip()
        assert token_path.stat().st_mode & 0o777 == 0o600
        ws, _ = await handshake(f"ws://127.0.0.1:{ws_port}/driver", token=token)
        await send(ws, batch(1, [event(1)]))
        assert (await recv(ws))["accepted"] == [event(1)["event_id"]]
        status, body = await asyncio.to_thread(
            http, f"http://127.0.0.1:{http_port}", "GET", f"/api/instances/{INSTANCE}/events", None, token
        )
        assert status == 200 and len(body["events"]) == 1
        proc.terminate()
        assert await close_code(ws) == 1001
        async with asyncio.timeout(10):
            rest = await proc.stderr.read()
        assert await proc.wait() == 0
        assert token.encode() not in rest
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_instance_shows_the_last_heartbeats_activity(cp: ControlPlane) -> None:
    ws, _ = await handshake(cp.url)
    activity = {
        "provider_pid": 812,
        "provider_cpu_ms": 5230,
        "provider_rss_mb": 412.5,
        "provider_processes": 3,
        "last_provider_output_ms_ago": 1200,
        "tool_call_id": "call-7",
        "tool_running_ms": 64000,
    }
    beat = {
        "type": "heartbeat",
        "at": "2026-11-30T10:00:00.000Z",
        "state": "running",
        "run_id": "r1",
        "outbox": {"lossless_pending": 0, "best_effort_dropped": 0},
        "activity": activity,
    }
    with cp.subscribe(INSTANCE) as sub:
        await send(ws, beat)
        async with asyncio.timeout(5):
            async for item in sub:
                if item.get("type") == "heartbeat":
                    break
    status, body = await call(cp, "GET", f"/api/instances/{INSTANCE}")
    assert status == 200
    assert body["activity"] == activity and body["last_heartbeat"]["activity"] == activity
    assert body["activity_line"] == (
        "provider pid 812: 3 processes, 412.5 MB, cpu 5.2 s | last output 1.2 s ago | tool call-7 running 64.0 s"
    )
    await ws.close()
