"""Reports of journal rows that failed their check (PROTOCOL §9): `diagnostic.reported{journal.tampered}`.

The journal finds them when it opens and when it reads a row back (commands, counters, runs, texts,
the transcript, event bodies about to be sent); the process records file is checked before any signal.
Each finding names its table and key (the seq for events). Findings that arrive together are
reported one diagnostic per table and reason, with the first 100 keys and the count, so an agent that
inserts a million rows costs a few diagnostics, not a million. The diagnostics are lossless.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio

from driver import containment, logs
from driver.keeper import state as keeper_state
from driver.queue.journal_rows import Finding

if TYPE_CHECKING:
    from driver.kernel.core import Kernel

log = logs.get("driver.kernel.tamper")

KEYS_LISTED = 100
POLL_S = 1.0  # the journal's own findings (made in worker threads) are collected at this pace


def diagnostics(findings: list[Finding]) -> list[dict[str, Any]]:
    """One `diagnostic.reported` payload per (table, reason), in the order first found."""
    groups: dict[tuple[str, str], list[str]] = {}
    for f in findings:
        groups.setdefault((f.table, f.reason), []).append(f.key)
    out = []
    for (table, reason), keys in groups.items():
        why = "has no valid MAC" if reason == "mac" else "holds a value of a type the driver never writes"
        details: dict[str, Any] = {"table": table, "key": keys[0], "reason": reason, "count": len(keys)}
        if keys[0].isascii() and keys[0].isdigit():
            details["seq"] = int(keys[0])
        if len(keys) > 1:
            details["keys"] = keys[:KEYS_LISTED]
        out.append(
            {
                "code": "journal.tampered",
                "severity": "error",
                "message": f"{len(keys)} row(s) of {table} {why}: set aside, never sent or acted on",
                "details": details,
            }
        )
    return out


class TamperReports:
    def __init__(self, kernel: Kernel) -> None:
        self.k = kernel
        self._wake = anyio.Event()
        kernel.outbox.on_findings = self.wake

    def wake(self) -> None:
        self._wake.set()

    def take(self) -> list[Finding]:
        k = self.k
        return [*k.journal.take_findings(), *k.outbox.take_findings(), *containment.take_findings()]

    async def run(self) -> None:
        await self.k.ready.wait()
        while True:
            findings = self.take()
            for payload in diagnostics(findings):
                log.error("journal.tampered", **payload["details"])
                await self.k.emit("diagnostic.reported", payload)
            for payload in keeper_state.take_notices():  # a keeper's log that filled up (PROTOCOL §8.2)
                await self.k.emit("diagnostic.reported", payload)
            with anyio.move_on_after(POLL_S):
                await self._wake.wait()
            self._wake = anyio.Event()
