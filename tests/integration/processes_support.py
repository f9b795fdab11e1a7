"""What the process tests share: a started driver, process commands, and the output as the CP stored it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent_lab.controlplane.server import ControlPlane

from tests.integration.harness import INSTANCE, DriverProcess, boot_payload


def start_driver(
    tmp_path: Path, url: str, drivers: list[DriverProcess], name: str = "driver", **kw: Any
) -> DriverProcess:
    d = DriverProcess(tmp_path, boot_payload(tmp_path, url, **kw), name)
    drivers.append(d)
    return d


async def command(cp: ControlPlane, kind: str, timeout: float = 20.0, **fields: Any) -> dict[str, Any]:
    cid, _ = await cp.send_command(INSTANCE, kind, **fields)
    return await cp.wait_for_command_status(cid, timeout=timeout)


async def start_process(cp: ControlPlane, process_id: str, **fields: Any) -> dict[str, Any]:
    status = await command(cp, "process.start", process_id=process_id, **fields)
    assert status["status"] == "completed", status
    return status


def output_events(cp: ControlPlane, process_id: str) -> list[dict[str, Any]]:
    return [e["payload"] for e in cp.events(INSTANCE, "process.output") if e["payload"]["process_id"] == process_id]


def screen(cp: ControlPlane, process_id: str) -> tuple[str, list[tuple[int, int]]]:
    """The output as stored, joined by offset (a byte range twice, from a replay, counts once), and the
    gaps: [start, end) ranges of raw offsets no stored event covers."""
    pieces = sorted({(e["offset"], e["data"]) for e in output_events(cp, process_id)})
    text, at, gaps = [], 0, []
    for offset, data in pieces:
        size = len(data.encode())
        if offset > at:
            gaps.append((at, offset))
        if offset + size <= at:
            continue
        if offset < at:
            data = data.encode()[at - offset :].decode()
        text.append(data)
        at = max(at, offset + size)
    return "".join(text), gaps


async def wait_output(cp: ControlPlane, process_id: str, needle: str, timeout: float = 20.0) -> str:
    """Until `needle` is in the process's stored output (exact, offset-joined)."""
    await cp.wait_until(lambda: needle in screen(cp, process_id)[0], timeout)
    return screen(cp, process_id)[0]


async def wait_exited(cp: ControlPlane, process_id: str, timeout: float = 20.0) -> dict[str, Any]:
    event = await cp.wait_for_event(
        INSTANCE, lambda e: e["payload"]["process_id"] == process_id, timeout=timeout, kinds="process.exited"
    )
    payload: dict[str, Any] = event["payload"]
    return payload


def alive(pid: int) -> bool:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return raw[raw.rfind(")") + 2 :].split()[0] != "Z"


def descendants(pid: int) -> set[int]:
    """The live process tree below `pid`, from /proc."""
    out: set[int] = set()
    todo = [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*"):
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue
            for k in kids:
                if k not in out:
                    out.add(k)
                    todo.append(k)
    return out


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
