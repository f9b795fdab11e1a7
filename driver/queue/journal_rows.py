"""What the journal reports about rows it will not use, and the crash points of its transactions.

A row that fails its MAC (rowmac) or holds a value of a type the driver never writes is *set aside*:
moved to the `set_aside` table (kept for an operator, bounded), never sent or acted on, and reported
once as a `Finding`; the kernel turns findings into lossless `diagnostic.reported{journal.tampered}`.

Crash points (tests only): `AGENT_DRIVER_CRASH_POINT=<what>.<where>:<n>` makes the process SIGKILL
itself at the n-th journal transaction that writes <what> (`events`, `deletions` or `commands`), at
<where>: `before` (nothing of it written), `inside` (its statements run, not committed) or `after`
(committed, nothing in memory updated yet). Read once, at import, and only when set; unset, a check
is one attribute read. No other I/O here.
"""

from __future__ import annotations

import os
import signal
import sys

import msgspec


class Finding(msgspec.Struct, frozen=True):
    """A journal row that was set aside: its table, its key (a seq, a command_id, a meta key), why."""

    table: str
    key: str
    reason: str  # "mac" (no valid MAC: edited, inserted, or from a driver before MACs) or "type"


def row_blob(values: tuple[object, ...]) -> bytes:
    """The set-aside copy of a row: JSON (bytes as base64), whatever the types an agent stored."""
    safe = [v if v is None or isinstance(v, int | float | str | bytes) else repr(v) for v in values]
    return msgspec.json.encode(safe)


CRASH_ENV = "AGENT_DRIVER_CRASH_POINT"
WHATS = frozenset({"events", "deletions", "commands"})
WHERES = frozenset({"before", "inside", "after"})


class CrashPoint:
    def __init__(self, spec: str | None) -> None:
        self.armed = False
        self.what = self.where = ""
        self.nth = 0
        self.seen = 0
        if not spec:
            return
        point, _, count = spec.partition(":")
        what, _, where = point.partition(".")
        if what not in WHATS or where not in WHERES or not (count.isascii() and count.isdigit()):
            raise ValueError(f"{CRASH_ENV} must be <events|deletions|commands>.<before|inside|after>:<n>, not {spec!r}")
        self.what, self.where, self.nth, self.armed = what, where, max(1, int(count)), True

    def reached(self, where: str, events: bool, deletions: bool, commands: bool) -> None:
        """Called at each boundary of each journal transaction with what it writes."""
        if where != self.where:
            return
        if not {"events": events, "deletions": deletions, "commands": commands}[self.what]:
            return
        self.seen += 1  # each transaction passes each boundary once
        if self.seen == self.nth:
            os.kill(os.getpid(), signal.SIGKILL)


def _from_env() -> CrashPoint:
    try:
        return CrashPoint(os.environ.get(CRASH_ENV) or None)
    except ValueError as exc:  # a test's typo: said once, and no crash point (never a traceback)
        sys.stderr.write(f"agent-driver: {exc}; ignored\n")
        return CrashPoint(None)


CRASH = _from_env()
