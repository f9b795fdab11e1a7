"""Downloads from a server that trickles bytes (issue 19 item 5, PROTOCOL §5, §6.4, §6.5), through the
REAL driver process: `turn.cancel` ends a run that is downloading an attachment at once (well within
§5's bounds), an attachment and a skill each have an overall deadline, and the driver carries on.

Every read of the trickle is well inside the per-read timeout, so only an overall deadline or an
abandoned worker can end these downloads; the server stops by itself (bounded bytes and time)."""

from __future__ import annotations

import hashlib
import http.server
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.faults.test_faults import booted, status
from tests.integration.harness import INSTANCE, DriverProcess, boot_payload, control_plane

pytestmark = pytest.mark.faults

BODY = bytes(range(256)) * 40  # 10,240 bytes: at 20 bytes a second, over 8 minutes
STEP_S = 0.05
STEP_BYTES = 1


class Trickle:
    """An HTTP server on loopback that sends BODY one byte every STEP_S, for at most 60 s a request."""

    def __init__(self) -> None:
        self.connected = threading.Event()  # a client is being served
        self.hung_up = threading.Event()  # ... and it went away before the end
        trickle = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Length", str(len(BODY)))
                self.end_headers()
                trickle.connected.set()
                stop = time.monotonic() + 60
                try:
                    for i in range(0, len(BODY), STEP_BYTES):
                        if time.monotonic() > stop:
                            return
                        self.wfile.write(BODY[i : i + STEP_BYTES])
                        self.wfile.flush()
                        time.sleep(STEP_S)  # the trickle itself (a server thread, not a wait in a test)
                except OSError:
                    trickle.hung_up.set()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/blob.bin"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Trickle:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def trickle() -> Iterator[Trickle]:
    with Trickle() as t:
        yield t


async def wait_thread_event(event: threading.Event, timeout: float) -> bool:
    return await anyio.to_thread.run_sync(event.wait, timeout)


def attachment(url: str) -> dict[str, Any]:
    return {"name": "blob.bin", "url": url, "sha256": hashlib.sha256(BODY).hexdigest(), "size": len(BODY)}


@pytest.mark.serial  # ended within 3 s
async def test_cancel_ends_a_run_downloading_an_attachment(tmp_path: Path, trickle: Trickle) -> None:
    async with control_plane(tmp_path) as cp:
        d = DriverProcess(tmp_path, boot_payload(tmp_path, cp.url))
        try:
            await booted(cp)
            body = {"text": "[[say:never]]", "attachments": [attachment(trickle.url)]}
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-1", input=body)
            assert await wait_thread_event(trickle.connected, 20)
            t0 = time.monotonic()
            cancel, _ = await cp.send_command(INSTANCE, "turn.cancel", run_id="run-1", reason="user")
            assert (await status(cp, cid, timeout=20))["status"] == "cancelled"
            took = time.monotonic() - t0
            print(f"turn.cancel during an attachment download: input.start cancelled after {took * 1000:.0f} ms")
            assert took < 3.0, took  # no provider to interrupt: ended at once, far inside §5's 5 + 3 s
            assert (await status(cp, cancel, timeout=10))["status"] == "completed"
            [term] = cp.events(INSTANCE, kinds="run.cancelled", run_id="run-1")
            assert term["payload"]["requested_by"] == "control_plane"
            # The abandoned worker hung up on the server (its socket was shut down), and left no file.
            assert await wait_thread_event(trickle.hung_up, 10)
            inputs = tmp_path / "cwd" / "inputs"
            assert not (inputs / "blob.bin").exists()
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-2", input={"text": "[[say:ok]]"})
            assert (await status(cp, cid, timeout=30))["status"] == "completed"
            assert list(inputs.iterdir()) == []  # nor its temporary file
            assert d.proc.poll() is None
        finally:
            d.close()


async def test_attachment_and_skill_downloads_have_an_overall_deadline(tmp_path: Path, trickle: Trickle) -> None:
    async with control_plane(tmp_path) as cp:
        payload = boot_payload(tmp_path, cp.url)
        payload["execution"]["skills"] = [
            {"name": "slow", "archive_url": trickle.url, "sha256": "0" * 64, "mount_path": "skills/slow"}
        ]
        env = {"AGENT_DRIVER_ATTACHMENT_TIMEOUT_MS": "1500", "AGENT_DRIVER_SKILL_TIMEOUT_MS": "1500"}
        t0 = time.monotonic()
        d = DriverProcess(tmp_path, payload, extra_env=env)
        try:
            diag = await cp.wait_for_event(
                INSTANCE,
                lambda e: e["kind"] == "diagnostic.reported" and e["payload"]["code"] == "skill.failed",
                timeout=20,
            )
            assert "1.5 s" in diag["payload"]["message"], diag["payload"]["message"]
            await booted(cp)
            assert time.monotonic() - t0 < 15  # the skill did not hold the start for its whole trickle
            body = {"text": "[[say:never]]", "attachments": [attachment(trickle.url)]}
            t1 = time.monotonic()
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-1", input=body)
            st = await status(cp, cid, timeout=20)
            assert st["status"] == "failed"
            assert st["error"]["code"] == "input.attachment_invalid"
            assert "1.5 s" in st["error"]["message"], st["error"]["message"]
            assert 1.4 < time.monotonic() - t1 < 10
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-2", input={"text": "[[say:ok]]"})
            assert (await status(cp, cid, timeout=30))["status"] == "completed"
            assert d.proc.poll() is None
        finally:
            d.close()
