"""A raw protocol client for the control plane tests: plain `websockets` and hand-written frames."""

from __future__ import annotations

import asyncio
import json
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

TOKEN = "test-token-0123456789"
OTHER_TOKEN = "other-token-9876543210"
OPERATOR_TOKEN = "operator-token-5555555555"  # the fault API's (PROTOCOL §9), no driver's
INSTANCE = "drv-01TEST"
TIMEOUT = 5.0


def hello(instance: str = INSTANCE, epoch: int = 1, last_command_seq: int = 0, **extra: Any) -> dict[str, Any]:
    return {
        "type": "hello",
        "protocol": 1,
        "driver_instance_id": instance,
        "epoch": epoch,
        "driver_version": "0.1.0",
        "pid": 4242,
        "runtime": "claude-agent-sdk",
        "revision": "rev-1",
        "session_kind": "cattle",
        "capabilities": [{"id": "text_stream", "supported": True}, {"id": "usage", "supported": False}],
        "last_command_seq": last_command_seq,
        "outbox": {"lossless_pending": 0, "oldest_pending_seq": None},
        "started_at": "2026-11-29T10:00:00.000Z",
        **extra,
    }


def event(
    seq: int,
    kind: str = "run.started",
    *,
    epoch: int = 1,
    instance: str = INSTANCE,
    run_id: str | None = "run-1",
    payload: dict[str, Any] | None = None,
    delivery: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    if payload is None:
        payload = {
            "run.started": {"run_id": run_id, "revision": "rev-1", "input_summary": "hi"},
            "message.delta": {"message_id": "msg-1", "text": f"chunk {seq}"},
            "message.completed": {"message_id": "msg-1", "role": "assistant", "text": "all"},
        }[kind]
    return {
        "event_id": f"{instance}/{epoch}/{seq:06d}",
        "seq": seq,
        "epoch": epoch,
        "kind": kind,
        "delivery": delivery or ("best_effort" if kind.endswith(".delta") else "lossless"),
        "session_id": "ses-1",
        "run_id": run_id,
        "occurred_at": "2026-11-29T10:00:01.250Z",
        "payload": payload,
        **extra,
    }


def batch(n: int, events: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "events", "batch": n, "events": events}


async def dial(
    url: str,
    *,
    token: str | None = TOKEN,
    instance: str | None = INSTANCE,
    subprotocol: bool = True,
    ssl: Any = None,
) -> ClientConnection:
    headers = {}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    if instance is not None:
        headers["Agent-Driver-Instance"] = instance
    return await connect(
        url,
        additional_headers=headers,
        subprotocols=["agent-driver.v1"] if subprotocol else None,  # type: ignore[list-item]
        open_timeout=TIMEOUT,
        ping_interval=None,
        ssl=ssl,
    )


async def send(ws: ClientConnection, frame: dict[str, Any]) -> None:
    await ws.send(json.dumps(frame))


async def recv(ws: ClientConnection, timeout: float = TIMEOUT) -> dict[str, Any]:
    async with asyncio.timeout(timeout):
        data = await ws.recv()
    frame = json.loads(data)
    assert isinstance(frame, dict)
    return frame


async def handshake(
    url: str, *, instance: str = INSTANCE, epoch: int = 1, last_command_seq: int = 0, token: str = TOKEN
) -> tuple[ClientConnection, dict[str, Any]]:
    ws = await dial(url, token=token, instance=instance)
    await send(ws, hello(instance, epoch, last_command_seq))
    welcome = await recv(ws)
    assert welcome["type"] == "welcome", welcome
    return ws, welcome


async def close_code(ws: ClientConnection, timeout: float = TIMEOUT) -> int | None:
    """Read until the server closes; the close code it sent (None: no close frame, e.g. dropped TCP)."""
    async with asyncio.timeout(timeout):
        try:
            while True:
                await ws.recv()
        except ConnectionClosed as exc:
            return None if exc.rcvd is None else exc.rcvd.code


def http(
    base: str, method: str, path: str, body: dict[str, Any] | None = None, token: str | None = TOKEN
) -> tuple[int, Any]:
    """Blocking HTTP call (run it with asyncio.to_thread)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method)
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def self_signed_cert(folder: Path) -> tuple[Path, Path]:
    """A throwaway certificate for 127.0.0.1 and localhost (cert.pem, key.pem), made with openssl."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    return cert, key
