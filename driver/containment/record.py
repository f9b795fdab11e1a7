"""Cleaning up after a predecessor (PROTOCOL §8): the record of what this driver process started.

The pid, process group and start time (field 22 of `/proc/<pid>/stat`) of every process spawned
through `driver.containment.wrapper` are recorded in `state_dir/driver/processes.json`. A new driver process,
holding the `state_dir` lock, kills what is recorded there before it starts its own provider: a leader
only when its start time still matches (so a reused pid is never signalled), and members of a recorded
group whose leader is gone only when they started after it.

The other half of containment, the wrapper every provider dies with, is `driver.containment.wrapper`, which
re-exports this module's functions under its own name (its callers predate the split).
"""

from __future__ import annotations

import contextlib
import hmac
import os
import signal
from collections.abc import Iterable
from pathlib import Path

import msgspec

from driver import agent_files, logs
from driver.queue.journal_rows import Finding
from driver.queue.rowmac import UNKEYED, RowMac

log = logs.get("driver.containment")  # one logger for both halves: the log lines keep their names

RECORD_NAME = "processes.json"
MAX_RECORD_BYTES = 1024 * 1024  # a few hundred entries at most; more is not the driver's own file

_record: ProcessRecord | None = None
_findings: list[Finding] = []


def start_time(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (clock ticks after boot): with the pid, a process's identity
    (a zombie's too: a reused pid stays recognisable while its new owner awaits reaping)."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def _zombie(pid: int) -> bool:
    fields = _stat_fields(pid)
    return fields is not None and fields[0] == "Z"


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: the fields start after the last ')'.
    return raw[raw.rfind(b")") + 2 :].decode().split()


class ProcessRecord:
    """`state_dir/driver/processes.json`: {"entries": [{pid, pgid, start}], "mac": hex} of the processes
    still running. The MAC (HMAC-SHA256 under the journal's key, driver/queue/rowmac.py) is checked
    before any signal: a file the driver did not write (an agent naming any same-uid process group,
    or a list from a driver before MACs) makes the next process signal nothing and report it."""

    def __init__(self, state_dir: Path, mac: RowMac | None = None) -> None:
        self.path = state_dir / "driver" / RECORD_NAME
        self.mac = mac or UNKEYED
        self._entries: dict[int, dict[str, int]] = {}

    def add(self, pid: int) -> None:
        start = start_time(pid)
        if start is None:
            return  # already gone: nothing to clean up later
        fields = _stat_fields(pid)
        pgid = int(fields[2]) if fields else pid
        self._entries[pid] = {"pid": pid, "pgid": pgid, "start": start}
        self._write()

    def remove(self, pid: int) -> None:
        if self._entries.pop(pid, None) is not None:
            self._write()

    def _mac_of(self, entries: bytes) -> str:
        return self.mac.of("processes", entries).hex()

    def _write(self) -> None:
        # Through agent_files: without the mount namespace (containment.degraded) the agent can plant a
        # fifo or a link at any name here, and a plain write held the event loop or wrote through it.
        # The record only helps the next driver clean up after a crash: a failed write is logged, and
        # never fails the provider start it was made for.
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        entries = msgspec.json.encode(list(self._entries.values()))
        data = b'{"entries":' + entries + b',"mac":"' + self._mac_of(entries).encode() + b'"}'
        try:
            agent_files.write_file(self.path.parent, RECORD_NAME, data)
        except agent_files.AgentFileError as exc:
            log.error("containment.record_unwritable", path=str(self.path), error=str(exc))

    def read(self) -> list[dict[str, int]]:
        """The entries, only when the file is the driver's own; else [] (and a finding)."""
        try:
            raw = agent_files.read_file(self.path.parent, RECORD_NAME, max_bytes=MAX_RECORD_BYTES)
        except agent_files.AgentFileError as exc:
            if os.path.lexists(self.path):
                _findings.append(Finding("processes", RECORD_NAME, "mac"))
                log.error("containment.record_tampered", path=str(self.path), error=str(exc))
            return []
        try:
            data = msgspec.json.decode(raw)
        except msgspec.DecodeError:
            data = None
        entries = data.get("entries") if isinstance(data, dict) else None
        mac = data.get("mac") if isinstance(data, dict) else None
        if (
            not isinstance(entries, list)
            or not isinstance(mac, str)
            or not hmac.compare_digest(mac, self._mac_of(msgspec.json.encode(entries)))
        ):
            _findings.append(Finding("processes", RECORD_NAME, "mac"))
            log.error("containment.record_tampered", path=str(self.path))
            return []
        return [
            e
            for e in entries
            if isinstance(e, dict)
            and {"pid", "pgid", "start"} <= e.keys()
            and all(type(e[k]) is int and e[k] > 0 for k in ("pid", "pgid", "start"))
        ]


def report(table: str, key: str, reason: str) -> None:
    """A state file under `state_dir/driver/` that failed its check (the keeper's, driver/keeper/state.py)."""
    _findings.append(Finding(table, key, reason))
    log.error("containment.record_tampered", table=table, key=key)


def take_findings() -> list[Finding]:
    """Record files that failed their check, for the kernel to report (`journal.tampered`)."""
    out = list(_findings)
    _findings.clear()
    return out


def reap(entries: Iterable[dict[str, int]]) -> list[int]:
    """SIGKILL what a predecessor left: verified leaders and their groups. Returns the pids killed."""
    killed: set[int] = set()
    for e in entries:
        pid, pgid, start = int(e["pid"]), int(e["pgid"]), int(e["start"])
        current = start_time(pid)
        if current is not None and current != start:
            continue  # the pid was reused: that process and its group are not ours
        if current is not None and not _zombie(pid):  # a zombie is dead already: nothing to kill
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
        for member in _group_members(pgid, not_before=start):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(member, signal.SIGKILL)
                killed.add(member)
    return sorted(killed)


def _group_members(pgid: int, *, not_before: int) -> list[int]:
    members: list[int] = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields and fields[0] != "Z" and int(fields[2]) == pgid and int(fields[19]) >= not_before:
            members.append(int(entry.name))
    return members


def track(state_dir: Path, mac: RowMac | None = None) -> list[int]:
    """Called once, holding the state_dir lock, before any provider starts: kill what a previous
    process left behind (only when its record passes its check), then record what this one starts.
    Returns the pids killed."""
    global _record
    record = ProcessRecord(state_dir, mac)
    killed = reap(record.read()) if os.path.lexists(record.path) else []
    if killed:
        log.warning("containment.predecessor_killed", pids=killed)
    record._write()  # start empty: everything recorded before is dead or was never ours
    _record = record
    return killed


def started(pid: int) -> None:
    if _record is not None:
        _record.add(pid)


def ended(pid: int) -> None:
    if _record is not None:
        _record.remove(pid)
