"""What every attack of agent_lab.evidence.attacks is given and returns: a `Target` (a started driver of
its own sandbox, and the rig's control plane) and an `Outcome` (passed or not, with the measured fact),
plus the /proc readings the attacks measure with. Nothing here attacks."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, NamedTuple

import anyio

from agent_lab.evidence.rig import DriverProc, Event, Rig, Sandbox


class Outcome(NamedTuple):
    passed: bool
    detail: str  # the measured fact, in one line


@dataclass
class Target:
    """A started driver of its own sandbox, the boot payload it runs, and the rig's control plane."""

    rig: Rig
    box: Sandbox
    driver: DriverProc
    boot: dict[str, Any]

    @property
    def instance(self) -> str:
        return self.box.instance

    async def raw(self, frame: dict[str, Any]) -> None:
        await self.rig.cp.send_raw(self.instance, json.dumps(frame))

    def final(self, command_id: str) -> dict[str, Any] | None:
        """The terminal command.update the driver sent (raw frames are not in the CP's store)."""
        done = [u for u in self.rig.cp.command_updates(command_id) if u["status"] != "accepted"]
        return done[-1] if done else None

    async def finals(self, command_ids: list[str], at_least: int, timeout: float = 30.0) -> list[dict[str, Any]]:
        await self.rig.cp.wait_until(lambda: sum(self.final(c) is not None for c in command_ids) >= at_least, timeout)
        return [f for c in command_ids if (f := self.final(c)) is not None]

    async def slow_run(self, run_id: str) -> str:
        cid, _ = await self.rig.cp.send_command(self.instance, "input.start", run_id=run_id, input={"text": "[[slow]]"})
        await self.rig.event(self.instance, lambda e: e["kind"] == "message.delta" and e["run_id"] == run_id, 30)
        return cid

    async def status(self, kind: str, timeout: float = 30.0, **fields: Any) -> dict[str, Any]:
        cid, _ = await self.rig.cp.send_command(self.instance, kind, **fields)
        return dict(await self.rig.cp.wait_for_command_status(cid, timeout=timeout))

    async def run(self, run_id: str, text: str, timeout: float = 60.0) -> str:
        """One input.start; its final command status (completed, failed, ...)."""
        status = await self.status("input.start", timeout=timeout, run_id=run_id, input={"text": text})
        return str(status["status"])

    async def diagnostic(self, code: str, after_seq: int = 0, timeout: float = 30.0) -> Event:
        return await self.rig.event(
            self.instance,
            lambda e: e["kind"] == "diagnostic.reported" and e["payload"]["code"] == code and e["seq"] > after_seq,
            timeout,
        )

    def successor(
        self,
        name: str,
        boot: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        args: tuple[str, ...] = (),
    ) -> DriverProc:
        """Another real driver on this sandbox's state_dir (stopped with the rig)."""
        d = DriverProc(self.box, boot or self.boot, name, env, args)
        self.rig.drivers.append(d)
        return d

    async def restarted(self, timeout: float = 60.0) -> Event:
        """The driver.started of a later driver process on this state_dir (a higher epoch)."""
        return await self.rig.event(self.instance, lambda e: e["kind"] == "driver.started" and e["epoch"] > 1, timeout)


async def exit_code(d: DriverProc, timeout: float) -> int | None:
    """The driver process's exit status, or None when it is still running after `timeout`."""
    with anyio.move_on_after(timeout):
        return await anyio.to_thread.run_sync(d.proc.wait, abandon_on_cancel=True)
    return None


def frame(command_id: str, seq: int, kind: str, **fields: Any) -> dict[str, Any]:
    return {"type": "command", "command_id": command_id, "seq": seq, "kind": kind, **fields}


def code(status: dict[str, Any] | None) -> str | None:
    return ((status or {}).get("error") or {}).get("code")


def peak_rss(pid: int) -> int:
    """The process's peak resident set (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise LookupError(f"no VmHWM for {pid}")


def mib(n: int) -> str:
    return f"{n / 2**20:+.0f} MiB"


def listening_ports(pid: int) -> set[int]:
    """The loopback TCP ports `pid` listens on (its socket inodes, matched in /proc/net/tcp)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    ports = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        cols = line.split()
        if cols[3] == "0A" and cols[9] in inodes and cols[1].startswith("0100007F:"):
            ports.add(int(cols[1].split(":")[1], 16))
    return ports


def environ_of(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(e.decode(errors="replace").split("=", 1) for e in raw.split(b"\0") if b"=" in e)


class KeyCatcher:
    """The agent's own listener: records the credential headers of every request it gets."""

    def __init__(self) -> None:
        seen: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                seen.append(self.headers.get("authorization", "") + self.headers.get("x-api-key", ""))
                self.send_response(500)
                self.send_header("content-length", "0")
                self.end_headers()

            do_GET = do_POST

            def log_message(self, *args: Any) -> None:
                pass

        self.seen = seen
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


async def flood(port: int, head: bytes, body_bytes: int) -> None:
    """One keyless request with a huge body, sent as fast as the listener takes it."""
    with contextlib.suppress(OSError):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(head)
            block = b"x" * 2**20
            for _ in range(body_bytes // len(block)):
                writer.write(block)
                await asyncio.wait_for(writer.drain(), 20)
            await asyncio.wait_for(reader.read(), 20)
        except (OSError, TimeoutError):
            pass
        finally:
            writer.close()


def closed_within(socks: list[socket.socket], seconds: float) -> int:
    """How many of `socks` the server closed (EOF or reset) within `seconds`."""
    deadline = time.monotonic() + seconds
    closed = 0
    for s in socks:
        try:
            while True:
                s.settimeout(max(deadline - time.monotonic(), 0.01))
                if s.recv(65536) == b"":
                    closed += 1
                    break
        except TimeoutError:
            pass
        except OSError:
            closed += 1
    return closed
