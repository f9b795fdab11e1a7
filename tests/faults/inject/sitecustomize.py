"""Faults injected into a REAL driver process from outside, for the supervision boundary's tests
(tests/faults/test_supervision_boundary.py): put this folder first on the driver's PYTHONPATH and name
the faults in INJECT_FAULTS (comma-separated). The driver's own code has no test hook: each fault
replaces one of its functions with one that raises an exception no code path names.

- `run`: preparing a run's input raises when its text holds `[[boom]]` (the message carries
  INJECT_SECRET, which the driver must redact);
- `scan`: the cwd scan for side effects raises while `cwd/boom-scan` exists;
- `permission`: resolving a permission with option `boom` raises;
- `telemetry`: the telemetry room's task raises the first time it runs;
- `heartbeat`: the link's heartbeat task raises the first time it runs;
- `outbox`: the outbox's journal writer raises at once.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

FAULTS = {f for f in os.environ.get("INJECT_FAULTS", "").split(",") if f}
SECRET = os.environ.get("INJECT_SECRET", "")


class Injected(RuntimeError):
    pass


def _install() -> None:
    if "run" in FAULTS:
        from driver.kernel import runpath

        prepare = runpath.RunPath.prepare_input

        async def prepare_input(self: Any, run_input: Any) -> Any:
            if "[[boom]]" in run_input.text:
                raise Injected(f"injected run fault (credential {SECRET})")
            return await prepare(self, run_input)

        runpath.RunPath.prepare_input = prepare_input  # type: ignore[method-assign]
    if "scan" in FAULTS:
        from driver.kernel import side_effects

        snapshot = side_effects.snapshot

        def scan(root: Path, exclude: list[Path], *args: Any) -> Any:
            if (Path(root) / "boom-scan").exists():
                raise Injected("injected scan fault")
            return snapshot(root, exclude, *args)

        side_effects.snapshot = scan  # type: ignore[assignment]
    if "permission" in FAULTS:
        from driver.ports import permissions

        resolve = permissions.PermissionBroker.resolve

        def resolve_or_boom(self: Any, request_id: str, option_id: str) -> Any:
            if option_id == "boom":
                raise Injected("injected permission fault")
            return resolve(self, request_id, option_id)

        permissions.PermissionBroker.resolve = resolve_or_boom  # type: ignore[method-assign]
    if "telemetry" in FAULTS:
        from driver.telemetry import room

        run = room.TelemetryRoom.run
        state = {"failed": False}

        async def telemetry_run(self: Any) -> None:
            if not state["failed"]:
                state["failed"] = True
                raise Injected("injected telemetry fault")
            await run(self)

        room.TelemetryRoom.run = telemetry_run  # type: ignore[method-assign]
    if "heartbeat" in FAULTS:
        from driver.net import link

        heartbeats = link.Link._heartbeats
        beat = {"failed": False}

        async def heartbeats_once(self: Any, ws: Any, welcome: Any) -> None:
            if not beat["failed"]:
                beat["failed"] = True
                raise Injected("injected heartbeat fault")
            await heartbeats(self, ws, welcome)

        link.Link._heartbeats = heartbeats_once  # type: ignore[method-assign]
    if "outbox" in FAULTS:
        from driver.queue import outbox

        async def writer(self: Any) -> None:
            raise Injected("injected journal writer fault")

        outbox.Outbox.run = writer  # type: ignore[method-assign]


if FAULTS:
    _install()
