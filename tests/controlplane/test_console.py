"""The console's HTTP side: the token gate, login, the SSE stream from the store, uploads and artifacts.

The page itself is exercised in a real Chromium by tests/controlplane/test_console_browser.py."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from agent_lab.controlplane import ControlPlane
from agent_lab.controlplane.console import ConsoleConfig, is_loopback

from tests.controlplane.client import INSTANCE, TOKEN, batch, event, handshake, send

CONSOLE_TOKEN = "console-token-abcdef123456"


@pytest.fixture
async def cp(tmp_path: Path) -> AsyncIterator[ControlPlane]:
    (tmp_path / "cwd" / "outputs").mkdir(parents=True)
    config = ConsoleConfig(token=CONSOLE_TOKEN, artifact_roots={INSTANCE: tmp_path / "cwd"})
    async with ControlPlane(
        tmp_path / "cp.db", tokens={TOKEN: {INSTANCE}}, close_timeout_s=1.0, console=config
    ) as plane:
        yield plane


def _request(
    base: str, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect)
    req = urllib.request.Request(base + path, data=body, method=method, headers=headers or {})
    try:
        with opener.open(req, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


async def request(cp: ControlPlane, method: str, path: str, body: bytes | None = None, **headers: str):  # type: ignore[no-untyped-def]
    assert cp.http_url is not None
    return await asyncio.to_thread(
        _request, cp.http_url, method, path, body, {k.replace("_", "-"): v for k, v in headers.items()}
    )


def origin(cp: ControlPlane) -> str:
    assert cp.http_url is not None
    return cp.http_url


async def login(cp: ControlPlane) -> str:
    """A session through the login form: the `Cookie` header value it sets."""
    status, headers, _ = await request(
        cp, "POST", "/login", f"token={CONSOLE_TOKEN}".encode(),
        content_type="application/x-www-form-urlencoded", origin=origin(cp),
    )  # fmt: skip
    assert status == 303, status
    return str(headers["Set-Cookie"].split(";")[0])


@pytest.fixture
async def cookie(cp: ControlPlane) -> str:
    return await login(cp)


def test_loopback_detection() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost") and is_loopback("[::1]")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4") and not is_loopback("example.org")


def test_console_tokens_must_fit_a_cookie() -> None:
    with pytest.raises(ValueError, match="printable ASCII"):
        ConsoleConfig(token="has space")
    with pytest.raises(ValueError, match="empty"):
        ConsoleConfig(token="")


async def test_page_asks_for_a_login_and_the_login_sets_a_cookie(cp: ControlPlane) -> None:
    status, _, page = await request(cp, "GET", "/")
    assert status == 200 and b'action="/login"' in page and b"console.js" not in page
    status, _, page = await request(
        cp, "POST", "/login", b"token=wrong-token", content_type="application/x-www-form-urlencoded"
    )
    assert status == 401 and b"not the console token" in page and b"wrong-token" not in page
    # The token in a URL logs nobody in (it would sit in the history); a login link carries a code.
    status, headers, page = await request(cp, "GET", f"/?token={CONSOLE_TOKEN}")
    assert status == 401 and "Set-Cookie" not in headers and b"one-time code" in page
    link = cp.console_login_url()
    assert link is not None and CONSOLE_TOKEN not in link
    query = "/?" + link.partition("/?")[2]
    status, headers, _ = await request(cp, "GET", query)
    assert status == 303 and headers["Location"] == "/"
    set_cookie = headers["Set-Cookie"]
    assert cp.http_url is not None
    port = cp.http_url.rsplit(":", 1)[1]
    name, _, value = set_cookie.split(";")[0].partition("=")
    assert name == f"agent_driver_console_{port}"  # bound to this console's port
    assert CONSOLE_TOKEN not in value and len(value) >= 40  # random, not the token
    assert "HttpOnly" in set_cookie and "SameSite=Strict" in set_cookie
    cookie = f"{name}={value}"
    # The link works once.
    status, headers, page = await request(cp, "GET", query)
    assert status == 401 and "Set-Cookie" not in headers and b"used already" in page
    # A cookie the console did not issue (e.g. the token itself) is no session.
    forged = f"{name}={CONSOLE_TOKEN}"
    assert (await request(cp, "GET", "/console/instances", cookie=forged))[0] == 401
    status, headers, page = await request(cp, "GET", "/", cookie=cookie)
    assert status == 200 and b"/static/console.js" in page
    assert "default-src 'self'" in headers["Content-Security-Policy"]
    status, _, script = await request(cp, "GET", "/static/console.js")
    assert status == 200 and b"EventSource" in script
    assert (await request(cp, "GET", "/static/../server.py"))[0] == 404


async def test_console_routes_need_the_token_and_the_api_accepts_it(cp: ControlPlane, cookie: str) -> None:
    status, _, body = await request(cp, "GET", "/console/instances")
    assert status == 401 and b"log in" in body
    status, _, body = await request(cp, "GET", "/console/instances", authorization=f"Bearer {TOKEN}")
    assert status == 401  # the driver's token is not the console's
    status, _, body = await request(
        cp, "POST", f"/api/instances/{INSTANCE}/commands", json.dumps({"kind": "session.reset"}).encode(),
        cookie=cookie, origin=origin(cp), content_type="application/json",
    )  # fmt: skip
    assert status == 201
    assert [c["kind"] for c in cp.commands(INSTANCE)] == ["session.reset"]
    # On loopback the API keeps its own rule: health is open, other routes need a token.
    assert (await request(cp, "GET", "/api/health"))[0] == 200
    assert (await request(cp, "GET", f"/api/instances/{INSTANCE}/events"))[0] == 401


async def test_the_stream_sends_what_the_store_committed_and_resumes_after_a_row(cp: ControlPlane, cookie: str) -> None:
    ws, _ = await handshake(cp.url)
    await send(ws, batch(1, [event(1), event(2, "message.delta")]))
    await cp.wait_for_event(INSTANCE, lambda e: e["seq"] == 2)
    await cp.send_command(INSTANCE, "session.reset", reason="from a test")
    assert cp.http_url is not None
    host, port = cp.http_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"GET /console/instances/{INSTANCE}/stream HTTP/1.1\r\nCookie: {cookie}\r\n\r\n".encode())
    await writer.drain()

    async def next_event() -> tuple[str, str | None, Any]:
        name, row, data = "", None, None
        async with asyncio.timeout(5):
            while True:
                line = (await reader.readline()).decode().rstrip("\n")
                if line.startswith("event: "):
                    name = line[7:]
                elif line.startswith("id: "):
                    row = line[4:]
                elif line.startswith("data: "):
                    data = json.loads(line[6:])
                elif line == "" and name:
                    return name, row, data

    head = await reader.readuntil(b"\r\n\r\n")
    assert b"text/event-stream" in head
    name, _, summary = await next_event()
    assert name == "instance" and summary["link"] == "connected" and summary["runtime"] == "claude-agent-sdk"
    name, _, commands = await next_event()
    assert name == "commands" and [c["kind"] for c in commands] == ["session.reset"]
    first, second = await next_event(), await next_event()
    assert [(e[0], e[2]["seq"], e[2]["delivery"]) for e in (first, second)] == [
        ("stored", 1, "lossless"),
        ("stored", 2, "best_effort"),
    ]
    await send(ws, batch(2, [event(3, "message.completed")]))
    name, _, third = await next_event()
    assert (name, third["seq"], third["kind"]) == ("stored", 3, "message.completed")
    await cp.send_command(INSTANCE, "turn.cancel", run_id="run-1", reason="x")
    name, _, cmd = await next_event()
    assert (name, cmd["kind"], cmd["status"]) == ("command", "turn.cancel", "pending")
    writer.close()

    # A browser reconnecting with Last-Event-ID gets only what it missed.
    reader, writer = await asyncio.open_connection(host, int(port))
    resume = f"Cookie: {cookie}\r\nLast-Event-ID: {second[1]}"
    writer.write(f"GET /console/instances/{INSTANCE}/stream HTTP/1.1\r\n{resume}\r\n\r\n".encode())
    await reader.readuntil(b"\r\n\r\n")
    names = [(await next_event())[0] for _ in range(3)]
    assert names == ["instance", "commands", "stored"]
    writer.close()
    await ws.close()


def upload_body(name: str, data: bytes) -> bytes:
    return json.dumps({"name": name, "data_b64": base64.b64encode(data).decode()}).encode()


async def test_upload_becomes_an_attachment_the_driver_can_fetch(cp: ControlPlane, cookie: str) -> None:
    data = b"attachment bytes\n" * 100
    where = f"/console/instances/{INSTANCE}/uploads"
    browser = {"cookie": cookie, "origin": origin(cp)}
    status, _, body = await request(cp, "POST", where, upload_body("notes.txt", data), **browser)
    assert status == 403 and b"JSON" in body  # the raw bytes (any Content-Type but JSON) are refused
    status, _, body = await request(
        cp, "POST", where, upload_body("notes.txt", data), content_type="application/json", **browser
    )
    assert status == 201
    attachment = json.loads(body)
    assert attachment["sha256"] == hashlib.sha256(data).hexdigest() and attachment["size"] == len(data)
    assert cp.http_url is not None
    path = attachment["url"].removeprefix(cp.http_url)
    assert (await request(cp, "GET", path))[2] == data  # no token: the random path is the credential
    status, _, body = await request(
        cp, "POST", where, upload_body("../x", b"x"), content_type="application/json", **browser
    )
    assert status == 400 and b"plain file name" in body


async def test_artifacts_are_served_only_while_their_hash_matches(
    cp: ControlPlane, tmp_path: Path, cookie: str
) -> None:
    content = b"report\n"
    (tmp_path / "cwd" / "outputs" / "report.txt").write_bytes(content)
    ws, _ = await handshake(cp.url)
    digest = hashlib.sha256(content).hexdigest()
    produced = event(
        1, "artifact.produced", payload={"path": "outputs/report.txt", "size": len(content), "sha256": digest}
    )
    escaping = event(2, "artifact.produced", payload={"path": "../cp.db", "size": 1, "sha256": "0" * 64})
    await send(ws, batch(1, [produced, escaping]))
    await cp.wait_for_event(INSTANCE, lambda e: e["seq"] == 2)
    url = f"/console/instances/{INSTANCE}/artifacts?event_id={produced['event_id']}"
    status, headers, body = await request(cp, "GET", url, cookie=cookie)
    assert status == 200 and body == content and 'filename="report.txt"' in headers["Content-Disposition"]
    (tmp_path / "cwd" / "outputs" / "report.txt").write_bytes(b"changed")
    status, _, body = await request(cp, "GET", url, cookie=cookie)
    assert status == 409 and b"changed since" in body
    status, _, _ = await request(
        cp, "GET", f"/console/instances/{INSTANCE}/artifacts?event_id={escaping['event_id']}", cookie=cookie
    )
    assert status == 403
    # A name that is not UTF-8: opened by its raw bytes (path_b64), named by the escaped form.
    raw = b"outputs/caf\xe9.txt"
    (tmp_path / "cwd").joinpath(os.fsdecode(raw)).write_bytes(content)
    odd = event(
        3,
        "artifact.produced",
        payload={
            "path": "outputs/caf\\xe9.txt",
            "path_b64": base64.b64encode(raw).decode(),
            "size": len(content),
            "sha256": digest,
        },
    )
    await send(ws, batch(2, [odd]))
    await cp.wait_for_event(INSTANCE, lambda e: e["seq"] == 3)
    url = f"/console/instances/{INSTANCE}/artifacts?event_id={odd['event_id']}"
    status, headers, body = await request(cp, "GET", url, cookie=cookie)
    assert status == 200 and body == content, body
    assert 'filename="caf\\\\xe9.txt"' in headers["Content-Disposition"]
    await ws.close()


async def test_off_loopback_every_request_needs_the_token(tmp_path: Path) -> None:
    config = ConsoleConfig(token=CONSOLE_TOKEN, host="0.0.0.0")
    async with ControlPlane(tmp_path / "cp.db", tokens={TOKEN: None}, console=config) as cp:
        assert cp.http_url is not None
        base = cp.http_url.replace("0.0.0.0", "127.0.0.1")
        assert (await asyncio.to_thread(_request, base, "GET", "/api/health"))[0] == 401
        headers = {"Authorization": f"Bearer {TOKEN}"}
        assert (await asyncio.to_thread(_request, base, "GET", "/api/faults", None, headers))[0] == 401
        headers = {"Authorization": f"Bearer {CONSOLE_TOKEN}"}
        assert (await asyncio.to_thread(_request, base, "GET", "/api/health", None, headers))[0] == 200
        assert (await asyncio.to_thread(_request, base, "GET", "/api/faults", None, headers))[0] == 200
        status, _, page = await asyncio.to_thread(_request, base, "GET", "/")
        assert status == 200 and b'action="/login"' in page  # the login form itself is reachable


def test_a_non_loopback_host_without_a_console_token_file_is_refused(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "driver.cli",
            "controlplane",
            "--db",
            str(tmp_path / "cp.db"),
            "--token-file",
            str(tmp_path / "cp.token"),
            "--http-host",
            "0.0.0.0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--console-token-file" in lines[0] and "0.0.0.0" in lines[0]
    assert not (tmp_path / "cp.db").exists()


def test_the_page_ships_as_package_data() -> None:
    """A non-editable install has the page only if pyproject's package-data names every static file."""
    import fnmatch
    import tomllib

    root = Path(__file__).resolve().parents[2]
    config = tomllib.loads((root / "lab" / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["agent_lab.controlplane.console"]
    static = root / "lab" / "agent_lab" / "controlplane" / "console" / "static"
    shipped = sorted(p.name for p in static.iterdir())
    assert {"index.html", "login.html", "console.css", "console.js"} <= set(shipped)
    for name in shipped:
        assert any(fnmatch.fnmatch(f"static/{name}", pattern) for pattern in patterns), name


async def test_the_cli_prints_a_console_login_link_and_it_logs_in(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "driver.cli", "controlplane", "--db", str(tmp_path / "cp.db"),
        "--token-file", str(tmp_path / "cp.token"), "--port", "0", "--http-port", "0",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    try:
        async with asyncio.timeout(60):
            while not (line := (await proc.stderr.readline()).decode()).startswith("console: "):
                assert line, "the control plane exited before printing its console line"
        url = line.split()[1]
        assert url.startswith("http://127.0.0.1:") and "/?login=" in url
        base, _, query = url.partition("/?")
        status, headers, _ = await asyncio.to_thread(_request, base, "GET", "/?" + query)
        assert status == 303 and headers["Set-Cookie"].startswith("agent_driver_console_")
        cookie = headers["Set-Cookie"].split(";")[0]
        assert (await asyncio.to_thread(_request, base, "GET", "/?" + query))[0] == 401  # once
        status, _, body = await asyncio.to_thread(_request, base, "GET", "/console/instances", None, {"Cookie": cookie})
        assert status == 200 and json.loads(body) == {"instances": []}
    finally:
        proc.terminate()
        async with asyncio.timeout(30):
            assert await proc.wait() == 0
