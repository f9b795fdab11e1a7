"""A control URL where nothing listens, as a newcomer meets it (issue 35): the real driver process says in
one warning which URL it cannot reach and that it never connected (or that a link it had was lost), does
not repeat that line at every redial, and a SIGINT or SIGTERM while it redials ends it at once with the
README's status (70: the lossless events it could not deliver stay journaled) and a last line saying so."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import Process
from anyio.streams.text import TextReceiveStream

from tests.integration.harness import INSTANCE, ROOT, TOKEN, boot_payload, control_plane

pytestmark = pytest.mark.anyio


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released: connecting to it is refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Lines:
    """The driver's stderr, read line by line as it writes them (each line is kept)."""

    def __init__(self, proc: Process) -> None:
        assert proc.stderr is not None
        self._stream = TextReceiveStream(proc.stderr)
        self._buf = ""
        self.seen: list[str] = []

    async def until(self, predicate: Any, timeout: float) -> str:
        with anyio.fail_after(timeout):
            while True:
                for line in self._take():
                    if predicate(line):
                        return line
                self._buf += await self._stream.receive()

    async def rest(self, timeout: float) -> list[str]:
        """Everything up to the end of the stream (the process exited)."""
        with anyio.fail_after(timeout):
            try:
                while True:
                    self._buf += await self._stream.receive()
            except anyio.EndOfStream:
                pass
        self._buf += "\n"
        return list(self._take())

    def _take(self) -> list[str]:
        *done, self._buf = self._buf.split("\n")
        self.seen += done
        return done


def warning(line: str) -> dict[str, Any] | None:
    try:
        rec = json.loads(line)
    except ValueError:
        return None
    return rec if rec.get("event") == "link.dial_failed" and rec.get("level") == "warning" else None


@asynccontextmanager
async def driver(tmp: Path, url: str, *args: str) -> AsyncIterator[tuple[Process, Lines]]:
    boot = tmp / "boot.json"
    boot.write_text(json.dumps(boot_payload(tmp, url)))
    boot.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_DRIVER")}
    env["AGENT_DRIVER_PROJECT_ROOT"] = str(ROOT)
    cmd = [sys.executable, "-m", "driver.cli", "run", "--boot-file", str(boot), *args]
    proc = await anyio.open_process(cmd, stdin=None, stdout=None, env=env, cwd=ROOT, start_new_session=True)
    try:
        yield proc, Lines(proc)
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)
        with anyio.CancelScope(shield=True):
            await proc.wait()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
async def test_never_connected_names_the_url_once_and_a_signal_exits_at_once(
    tmp_path: Path, sig: signal.Signals
) -> None:
    url = f"ws://127.0.0.1:{closed_port()}/driver"
    async with driver(tmp_path, url, "--log-level", "debug") as (proc, lines):
        first = warning(await lines.until(warning, timeout=30))
        assert first is not None
        assert first["url"] == url and first["state"] == "never connected" and first["attempts"] == 1
        assert url in first["message"] and "never connected" in first["message"]
        assert "ConnectionRefusedError" in first["error"] and "control.url" in first["message"]
        # Two more dials (at debug) within the minute: neither is a second warning.
        for _ in range(2):
            await lines.until(lambda s: '"link.dial_failed"' in s and '"level":"debug"' in s, timeout=30)
        assert [w for w in map(warning, lines.seen) if w] == [first]
        signalled = time.monotonic()
        proc.send_signal(sig)
        rest = await lines.rest(timeout=20)
        status = await proc.wait()
        took = time.monotonic() - signalled
    # The old driver waited out the 30 s drain bound for receipts no link could bring.
    assert took < 10, f"exit took {took:.1f} s"
    assert status == 70  # the driver's first events (driver.started, ...) stay journaled
    last = [s for s in rest if s.strip()][-1]
    assert last.startswith("agent-driver: stopped with ") and f"the control plane at {url} was never reached" in last
    assert "exiting 70" in last
    assert TOKEN not in "\n".join(lines.seen)


async def test_a_lost_link_says_lost(tmp_path: Path) -> None:
    async with control_plane(tmp_path) as cp:
        url = cp.url
        async with driver(tmp_path, url) as (proc, lines):
            await cp.wait_connected(INSTANCE, timeout=30)
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=30)
            await cp.stop()
            lost = warning(await lines.until(warning, timeout=30))
            assert lost is not None and lost["state"] == "lost" and lost["url"] == url
            assert "lost the control plane" in lost["message"]
            signalled = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            await lines.rest(timeout=20)
            status = await proc.wait()
            assert time.monotonic() - signalled < 10
            # Whatever was stored before the control plane went is not pending: 0 if nothing else was.
            assert status in (0, 70)
