"""Shared helpers for the kernel's cancellation and supervision tests: a real driver process with
bounds shortened through `AGENT_DRIVER_*` variables, and a look at its provider processes in /proc."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import anyio

from tests.integration.harness import INSTANCE, DriverProcess

TERMINALS = ("run.completed", "run.failed", "run.cancelled")


class Driver(DriverProcess):
    """The real driver process (as in tests/integration), with extra environment variables."""

    def __init__(self, tmp: Path, payload: dict[str, Any], name: str = "driver", env: dict[str, str] | None = None):
        super().__init__(tmp, payload, name, extra_env=env)


# -- processes --------------------------------------------------------------------------------------


def children(pid: int) -> list[int]:
    """Live (non-zombie) direct children of `pid`, from /proc."""
    out: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # Fields after the parenthesised command name: state, ppid, pgrp, ...
        rest = stat.rsplit(")", 1)[1].split()
        if int(rest[1]) == pid and rest[0] != "Z":
            out.append(int(entry))
    return sorted(out)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # killpg succeeds for a group whose members are all zombies: look for a live member.
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                rest = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(rest[2]) == pgid and rest[0] != "Z":
                return True
    return False


async def wait_group_gone(pgid: int, timeout: float = 5.0) -> None:
    """Wait (polling /proc, bounded) until no live process is left in group `pgid`."""
    with anyio.fail_after(timeout):
        while group_alive(pgid):  # noqa: ASYNC110 (no event tells us a process group is gone: poll /proc)
            await anyio.sleep(0.02)


def _leads_group(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except ProcessLookupError:
        return False


async def wait_provider(driver: Driver, timeout: float = 10.0, exclude: tuple[int, ...] = ()) -> int:
    """The pid (= its process group) of the driver's provider process, once it runs."""
    with anyio.fail_after(timeout):
        while True:
            # Group leaders only: a provider leads its own group; short-lived helpers (the containment
            # probe) run in the driver's.
            found = [p for p in children(driver.pid) if p not in exclude and _leads_group(p)]
            if found:
                return found[0]
            await anyio.sleep(0.02)  # polling /proc: nothing announces a new child


# -- control plane views ----------------------------------------------------------------------------


def terminals(cp: Any, run_id: str) -> list[dict[str, Any]]:
    return [e for e in cp.events(INSTANCE, run_id=run_id) if e["kind"] in TERMINALS]


async def wait_terminal(cp: Any, run_id: str, timeout: float = 30.0) -> dict[str, Any]:
    event: dict[str, Any] = await cp.wait_for_event(
        INSTANCE, lambda e: e["run_id"] == run_id and e["kind"] in TERMINALS, timeout=timeout
    )
    return event


async def wait_diagnostic(cp: Any, code: str, timeout: float = 20.0, after_seq: int = 0) -> dict[str, Any]:
    event: dict[str, Any] = await cp.wait_for_event(
        INSTANCE,
        lambda e: e["kind"] == "diagnostic.reported" and e["payload"]["code"] == code and e["seq"] > after_seq,
        timeout=timeout,
    )
    return event


def now() -> float:
    return time.monotonic()
