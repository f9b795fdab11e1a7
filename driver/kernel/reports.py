"""What a run leaves behind, reported beside its events (PROTOCOL §5, §6.5): the cwd scans a run's
side effects are measured with, the processes it left alive, and the artifacts under outputs/.

Each report is its own unit: one that fails is left out (reported through `driver.guard`), never the
run's terminal. The payloads are built without I/O (`side_effects_of`, `artifact_events`); the scans
run in worker threads.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from driver import guard
from driver.kernel import side_effects
from driver.kernel.runs import Run
from driver.kernel.side_effects import TreeSnapshot
from driver.ports import outputs

if TYPE_CHECKING:
    from driver.kernel.core import Kernel

T = TypeVar("T")

# The scan's bounds, named in an `artifacts.truncated` diagnostic.
OUTPUT_BOUNDS: dict[str, float] = {
    "files": outputs.MAX_FILES,
    "hash_bytes": outputs.MAX_HASH_BYTES,
    "entries": outputs.MAX_ENTRIES,
    "depth": outputs.MAX_DEPTH,
    "hash_s": outputs.MAX_HASH_S,
}


def side_effects_of(
    before: TreeSnapshot | None, after: TreeSnapshot | None, left: list[dict[str, Any]] | None
) -> dict[str, Any]:
    """PROTOCOL §5's `side_effects`: the files changed between the scans, the processes left. An
    incomplete picture says so: a scan that hit its bound, or one that failed (None)."""
    changed = [] if before is None or after is None else side_effects.files_changed(before, after)
    return {
        "files_changed": changed,
        "processes_left": left or [],
        "truncated": before is None or after is None or before.truncated or after.truncated,
    }


def artifact_events(report: outputs.Report, run_id: str | None) -> list[tuple[str, dict[str, Any]]]:
    """PROTOCOL §6.5: an `artifact.produced` per file, and a diagnostic for a refused or a cut scan."""
    events: list[tuple[str, dict[str, Any]]] = [
        ("artifact.produced", {"path": rel, "size": size, "sha256": digest}) for rel, size, digest in report.artifacts
    ]
    if report.refused is not None:
        events.append(
            (
                "diagnostic.reported",
                {
                    "code": "artifacts.refused",
                    "severity": "warning",
                    "message": f"no artifacts reported: {report.refused}",
                    "details": {"run_id": run_id},
                },
            )
        )
    if report.cut is not None:
        cut = report.cut
        events.append(
            (
                "diagnostic.reported",
                {
                    "code": "artifacts.truncated",
                    "severity": "warning",
                    "message": f"the outputs scan was cut at its {cut.reason} bound after {cut.reported} artifacts",
                    "details": {
                        "run_id": run_id,
                        "reason": cut.reason,
                        "reported": cut.reported,
                        "left": cut.left,
                        "bounds": dict(OUTPUT_BOUNDS),
                    },
                },
            )
        )
    return events


class RunReports:
    def __init__(self, kernel: Kernel) -> None:
        self.k = kernel

    def scan_exclusions(self) -> list[Path]:
        """What a cwd scan leaves out: the driver's own state and the attachments it downloads."""
        session = self.k.boot.session
        return [Path(session.state_dir), Path(session.cwd) / "inputs"]

    async def outputs_before(self, cwd: Path) -> outputs.Snapshot:
        """outputs/ as the run starts (empty when the scan failed: every file then counts as new)."""
        return await self._report("outputs scan", self._outputs_snapshot, cwd) or outputs.Snapshot()

    async def files_snapshot(self, cwd: Path) -> TreeSnapshot | None:
        return await self._report(
            "side effects scan", anyio.to_thread.run_sync, side_effects.snapshot, cwd, self.scan_exclusions()
        )

    async def side_effects(self, run: Run) -> dict[str, Any]:
        """PROTOCOL §5: the files under cwd changed since the run started, and the processes the run
        left alive: every descendant of the driver (the provider's tree, and commands the driver ran
        for it, like ACP terminals) that was not alive when the run started (the provider itself and
        its long-lived helpers are not the run's side effects)."""
        after = await self.files_snapshot(Path(self.k.boot.session.cwd))
        me = os.getpid()

        async def processes() -> list[dict[str, Any]]:
            return [
                p for p in side_effects.tree_processes([me]) if p["pid"] != me and p["pid"] not in run.processes_before
            ]

        left = await self._report("side effects processes", processes)
        return side_effects_of(run.files_before, after, left)

    async def artifacts(self, cwd: Path, before: outputs.Snapshot) -> None:
        """PROTOCOL §6.5: every file under outputs/ new or changed since the run started, within the
        scan's bounds (driver.ports.outputs); a refused or cut scan is said in a diagnostic."""
        report = await self._report(
            "artifacts", anyio.to_thread.run_sync, self._changed_outputs, cwd, before, self.scan_exclusions()
        )
        if report is None:
            return
        k = self.k
        for kind, payload in artifact_events(report, k.run.run_id if k.run else None):
            await k.emit(kind, payload)

    async def _report(self, unit: str, fn: Callable[..., Awaitable[T]], *args: Any) -> T | None:
        """Run one report's step; an unexpected error leaves the report out (None), reported."""
        try:
            return await fn(*args)
        except Exception as exc:
            await guard.report(self.k, unit, exc, run_id=self.k.run.run_id if self.k.run else None)
            return None

    async def _outputs_snapshot(self, cwd: Path) -> outputs.Snapshot:
        return await anyio.to_thread.run_sync(self._snapshot_outputs, cwd, self.scan_exclusions())

    # In the worker thread: the driver's own inodes are read at each scan (its WAL and records come and go).
    def _snapshot_outputs(self, cwd: Path, exclude: list[Path]) -> outputs.Snapshot:
        return outputs.snapshot(cwd, exclude, private=self.k.files.private_inodes())

    def _changed_outputs(self, cwd: Path, before: outputs.Snapshot, exclude: list[Path]) -> outputs.Report:
        return outputs.changed(cwd, before, exclude, private=self.k.files.private_inodes())
