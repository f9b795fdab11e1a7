"""Record every frame kind of a real run: the real driver (stubborn ACP agent) against the reference
control plane, through a recording relay on loopback (issue 35).

`record(tmp)` runs the scripted flow and returns what crossed the link, in order; `render()` writes
it as docs/transcript.md and `parse()` reads that file back. `signature()` names what an entry is
(`hello`, `command input.start`, `event run.completed`, `close 4409`, ...) and `shape()` what its
fields are (names and JSON types, values dropped), so tests/protocol/test_transcript.py compares a
fresh run with the file without caring about ids, times or batching.

Regenerate the file after an intended change:
    AGENT_DRIVER_REGENERATE_TRANSCRIPT=1 .venv/bin/pytest tests/protocol/test_transcript.py
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from driver.protocol.frames import SUBPROTOCOL
from tests.integration.harness import INSTANCE, TOKEN, DriverProcess, boot_payload, control_plane

TO_CP = "driver → CP"
TO_DRIVER = "CP → driver"


@dataclass
class Entry:
    scenario: str
    direction: str
    frame: dict[str, Any]  # a frame, or {"close_code", "reason", "driver_exit"} for a close


Peer = ServerConnection | ClientConnection


class Relay:
    """A WebSocket relay that records every text frame and close, both ways, and passes them on."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.entries: list[Entry] = []
        self.scenario = ""
        self.port = 0
        self.closes: list[Entry] = []

    async def __aenter__(self) -> Relay:
        self._server = await serve(self._handle, "127.0.0.1", 0, subprotocols=[SUBPROTOCOL])  # type: ignore[list-item]
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        await self._server.wait_closed()

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/driver"

    def _add(self, direction: str, frame: dict[str, Any]) -> Entry:
        entry = Entry(self.scenario, direction, frame)
        self.entries.append(entry)
        return entry

    async def _handle(self, down: ServerConnection) -> None:
        assert down.request is not None
        headers = {k: down.request.headers[k] for k in ("Authorization", "Agent-Driver-Instance")}
        async with connect(self.upstream, additional_headers=headers, subprotocols=[SUBPROTOCOL]) as up:  # type: ignore[list-item]
            tasks = [
                asyncio.ensure_future(self._pump(down, up, TO_CP)),
                asyncio.ensure_future(self._pump(up, down, TO_DRIVER)),
            ]
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _pump(self, src: Peer, dst: Peer, direction: str) -> None:
        try:
            async for message in src:
                self._add(direction, json.loads(message))
                await dst.send(message)
        except ConnectionClosed:
            pass
        code = src.close_code or 1000
        reason = src.close_reason or ""
        if direction == TO_DRIVER and code != 1000:
            self.closes.append(self._add(direction, {"close_code": code, "reason": reason, "driver_exit": None}))
        with contextlib.suppress(ConnectionClosed):
            await dst.close(code if code not in (1005, 1006) else 1011, reason)


async def record(tmp: Path) -> list[Entry]:
    """The scripted flow: a turn, a permission round, a CP restart, then each close the driver obeys."""
    drivers: list[DriverProcess] = []

    def driver(name: str, state: str = "", **kw: Any) -> DriverProcess:
        payload = boot_payload(tmp, relay.url, state_dir=str(tmp / f"state-{state or name}"))
        payload["driver_instance_id"] = kw.get("instance", INSTANCE)
        payload["control"]["token"] = kw.get("token", TOKEN)
        d = DriverProcess(tmp, payload, name)
        drivers.append(d)
        return d

    async def redialled(close: Any) -> None:
        """Run `close` (it ends the current link), then wait until the driver is linked again."""
        closed = len(cp.link_history(INSTANCE))
        await close()
        # The old link is in the history before it leaves the table: connected again means redialled.
        await cp.wait_until(lambda: len(cp.link_history(INSTANCE)) > closed and cp.connected(INSTANCE), 30)

    async def exit_of(d: DriverProcess) -> None:
        status = await d.wait(30)
        relay.closes[-1].frame["driver_exit"] = status

    async with control_plane(tmp) as cp, Relay(cp.url) as relay:
        try:
            relay.scenario = "A turn"
            d1 = driver("d1")
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=30)
            await cp.wait_until(lambda: cp.last_heartbeat(INSTANCE) is not None, timeout=10)
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": "[[say:Hello]]"})
            await cp.wait_for_command_status(cid, timeout=30)

            relay.scenario = "A permission asked and answered"
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-2", input={"text": "[[perm]]"})
            asked = await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "permission.requested", timeout=30)
            option = asked["payload"]["options"][0]["option_id"]
            rid = asked["payload"]["request_id"]
            resolve, _ = await cp.send_command(INSTANCE, "permission.resolve", request_id=rid, option_id=option)
            await cp.wait_for_command_status(resolve, timeout=30)
            await cp.wait_for_command_status(cid, timeout=30)

            relay.scenario = "The control plane restarts (1012): the driver redials and says hello again"
            await redialled(lambda: cp.restart(1012))

            relay.scenario = "Closes the driver redials after (4400, 1011, 1013, 1001): the same epoch again"
            for code in (4400, 1011, 1013, 1001):
                await redialled(lambda c=code: cp.close_link(INSTANCE, c, "closed by the transcript"))

            relay.scenario = "The driver restarts on its state_dir: epoch 2"
            # Linked again from the CP's side is not yet welcomed from the driver's: a SIGTERM before the
            # welcome stops it at once with its resends still journaled (exit 70). A heartbeat comes after.
            await cp.wait_for(
                INSTANCE, lambda i: i["type"] == "heartbeat" and i["outbox"]["lossless_pending"] == 0, timeout=30
            )
            d1.signal(signal.SIGTERM)
            assert await d1.wait(30) == 0
            d1b = driver("d1b", state="d1")
            await cp.wait_until(lambda: (cp.hello(INSTANCE) or {}).get("epoch") == 2 and cp.connected(INSTANCE), 30)

            relay.scenario = "A driver with an older epoch (4409): it exits 75"
            await exit_of(driver("d2"))

            relay.scenario = "The control plane terminates the instance (4410): the driver exits 0"
            await cp.terminate(INSTANCE)
            await exit_of(d1b)

            relay.scenario = "A bad token (4401): the driver exits 77"
            await exit_of(driver("d3", token="not-the-token"))

            relay.scenario = "An instance the token does not allow (4403): the driver exits 77"
            await exit_of(driver("d4", instance="drv-other"))
        finally:
            for d in drivers:
                d.close()
    return [normalise(e, tmp) for e in relay.entries]


_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")
_VOLATILE = {"pid": 4242, "provider_pid": 4243, "connection_id": "con-1"}


def normalise(entry: Entry, tmp: Path) -> Entry:
    """Values that differ from run to run (times, pids, connection ids, paths) made stable."""

    def walk(value: Any, key: str = "") -> Any:
        if isinstance(value, dict):
            return {k: walk(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, key) for v in value]
        if key in _VOLATILE and value is not None:
            return _VOLATILE[key]
        if isinstance(value, str):
            if _TIME.match(value):
                return "2026-01-01T00:00:00.000Z"
            return value.replace(str(tmp), "/sandbox").replace(sys.executable, "python")
        return value

    return Entry(entry.scenario, entry.direction, walk(entry.frame))


def signature(frame: dict[str, Any]) -> str:
    if "close_code" in frame:
        return f"close {frame['close_code']}"
    kind = frame.get("type", "?")
    if kind == "command":
        return f"command {frame.get('kind')}"
    if kind == "command.update":
        return f"command.update {frame.get('status')}"
    return str(kind)


def items(entries: list[Entry]) -> list[tuple[str, str, str, dict[str, Any]]]:
    """(scenario, direction, signature, frame) for every frame and, separately, every event."""
    out = []
    for e in entries:
        out.append((e.scenario, e.direction, signature(e.frame), e.frame))
        if e.frame.get("type") == "events":
            out += [(e.scenario, e.direction, f"event {ev['kind']}", ev) for ev in e.frame["events"]]
    return out


def shape(value: Any) -> Any:
    """Field names and JSON types; a list's shape is its elements' merged shape."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        merged: Any = None
        for v in value:
            merged = merge(merged, shape(v))
        return ["list", merged]
    if value is None:
        return None
    return {bool: "boolean", int: "number", float: "number", str: "string"}[type(value)]


def merge(a: Any, b: Any) -> Any:
    if a is None:
        return b
    if b is None:
        return a
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: merge(a.get(k), b.get(k)) for k in sorted(a.keys() | b.keys())}
    return a


def differences(old: Any, new: Any, path: str = "$") -> list[str]:
    """Where two shapes disagree; null (or an empty list) agrees with anything."""
    if old is None or new is None or old == new:
        return []
    if isinstance(old, dict) and isinstance(new, dict):
        out = [f"{path}.{k}: only in the transcript" for k in old.keys() - new.keys()]
        out += [f"{path}.{k}: only in this run" for k in new.keys() - old.keys()]
        for k in old.keys() & new.keys():
            out += differences(old[k], new[k], f"{path}.{k}")
        return out
    if isinstance(old, list) and isinstance(new, list):
        return differences(old[1], new[1], f"{path}[]")
    return [f"{path}: {old} in the transcript, {new} in this run"]


HEADER = """# A transcript of the wire

Every frame kind of PROTOCOL.md, as the real driver and the reference control plane
(`lab/agent_lab/controlplane/`) exchanged them in one run: the driver runs the stubborn ACP test agent
(`lab/agent_lab/testing/agents/`), and a relay between the two recorded each frame and each close.
Values that differ per run are normalised (times, pids, connection ids, paths); everything else is as
sent. Each section shows the first frame of each kind in its scenario; an `events` frame is shown with its
first event, and every event kind that the run produced then follows on its own.

This file is generated: `tests/protocol/test_transcript.py` reruns the flow, compares the frames' shapes
(field names, JSON types, frame and event kinds) with this file, and validates every frame against
`schemas/frames.schema.json`. After an intended change, regenerate it:
`AGENT_DRIVER_REGENERATE_TRANSCRIPT=1 .venv/bin/pytest tests/protocol/test_transcript.py`.

The closes after which the driver redials (1012, 4400, 1011, 1013, 1001) show `driver_exit: null`: the
driver stayed up and said `hello` again with the same epoch. The reference control plane closes with
4400 when the driver breaks the protocol (the real driver does not, so the run asks the control plane
to close with it); after 5 in a row the driver gives up (`driver/protocol/link.py`). Not in this run:
4408 (the relay answers the control plane's pings itself, so a silent driver cannot be shown through
it; `tests/faults/test_hostile_link.py` and `tests/controlplane/test_link.py` cover it), 1006 (a
dropped TCP connection has no close frame to forward) and 1009 (the driver halves its batches and
redials).
"""

_SECTION = re.compile(r"^#### `(?P<sig>[^`]+)` \((?P<dir>[^)]+)\)\n\n```json\n(?P<body>.*?)\n```", re.M | re.S)


def render(entries: list[Entry]) -> str:
    out = [HEADER]
    seen: set[str] = set()
    scenario = None
    for scen, direction, sig, frame in items(entries):
        if sig in seen:
            continue
        seen.add(sig)
        if scen != scenario:
            out.append(f"\n## {scen}\n")
            scenario = scen
        shown = {**frame, "events": frame["events"][:1]} if frame.get("type") == "events" else frame
        body = json.dumps(shown, indent=2, ensure_ascii=False)
        out.append(f"\n#### `{sig}` ({direction})\n\n```json\n{body}\n```\n")
    return "".join(out)


def parse(text: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """signature → (direction, frame) of every section of the file."""
    return {m["sig"]: (m["dir"], json.loads(m["body"])) for m in _SECTION.finditer(text)}
