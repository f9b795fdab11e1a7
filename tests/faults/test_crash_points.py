"""The crash-point harness (issue 19 item 7): the REAL driver process killed at every journal commit
boundary, then a new process on the same `state_dir`, then the invariants of `crash_checks` against
the reference control plane's store.

Deterministic points come from `AGENT_DRIVER_CRASH_POINT=<what>.<where>:<n>` (driver/queue/
journal_rows.py): the process SIGKILLs itself at the n-th transaction that writes events, deletions
or command statuses, before it begins, after its statements (uncommitted) or after its commit (nothing
in memory updated yet). Random points: SIGKILL from outside at a random moment under a flood.

The short variant (default run) takes one n per point; `-m long` takes several per point and more
random kills.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from agent_lab.controlplane.server import ControlPlane

from tests.faults.conftest import FLOOD
from tests.faults.crash_checks import check_store
from tests.integration.harness import INSTANCE, DriverProcess, boot_payload, control_plane

pytestmark = pytest.mark.faults

STEPS = 12
WHATS = ("events", "deletions", "commands")
WHERES = ("before", "inside", "after")
# The n-th transaction of each kind to die at, in the short run: early enough that the workload below
# surely reaches it (a driver start writes a few event transactions; each command two status ones).
SHORT_N = {"events": 4, "deletions": 2, "commands": 2}
LONG_N = {"events": (1, 2, 3, 6, 10), "deletions": (1, 2, 3, 5), "commands": (1, 2, 3, 4, 5)}


class Crashes:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.started: list[DriverProcess] = []

    def start(self, url: str, crash: str | None = None) -> DriverProcess:
        payload = boot_payload(self.tmp, url, acp_command=[sys.executable, str(FLOOD)])
        env = {"AGENT_DRIVER_CRASH_POINT": crash} if crash else {}
        d = DriverProcess(self.tmp, payload, f"driver{len(self.started) + 1}", extra_env=env)
        self.started.append(d)
        return d

    def close(self) -> None:
        for d in self.started:
            d.close()


async def _status_or_death(cp: ControlPlane, cid: str, d: DriverProcess, timeout: float = 40) -> bool:
    """Wait for `cid`'s terminal status at the CP or the driver's death; True when it died."""
    with anyio.fail_after(timeout):
        while d.proc.poll() is None:
            c = cp.command(cid)
            if c is not None and c["status"] in ("completed", "failed", "cancelled"):
                return False
            await anyio.sleep(0.05)  # polls two facts from two processes (no single event to wait on)
    return True


async def _workload(cp: ControlPlane, d: DriverProcess, runs: int) -> tuple[list[str], bool]:
    """Runs one after another while the driver lives; returns the command ids sent and whether it died."""
    sent: list[str] = []
    for i in range(runs):
        cid, _ = await cp.send_command(
            INSTANCE, "input.start", run_id=f"run-{i + 1}", input={"text": f"[[flood:{STEPS}:5]]"}
        )
        sent.append(cid)
        if await _status_or_death(cp, cid, d):
            return sent, True
    return sent, False


async def _recover_and_check(cp: ControlPlane, crashes: Crashes, sent: list[str], counted: list[int]) -> dict[str, Any]:
    d2 = crashes.start(cp.url)
    await cp.wait_connected(INSTANCE, timeout=30)
    hello = cp.hello(INSTANCE)
    assert hello is not None
    counted.append(hello["last_command_seq"])
    for cid in sent:
        try:
            st = await cp.wait_for_command_status(cid, timeout=30)
        except TimeoutError:
            c = cp.command(cid)
            raise AssertionError(
                f"command {cid} (seq {c and c['seq']}) never got a terminal status at the CP; "
                f"last_command_seq announced: {counted}"
            ) from None
        assert st["status"] in ("completed", "failed", "cancelled"), st
    # A heartbeat of the new process (the only one alive) with nothing lossless pending.
    await cp.wait_for(INSTANCE, lambda i: i["type"] == "heartbeat" and i["outbox"]["lossless_pending"] == 0, timeout=30)
    assert d2.proc.poll() is None, d2.stderr()[-2000:]
    return check_store(cp, counted, STEPS)


async def crash_at(tmp: Path, point: str) -> dict[str, Any]:
    crashes = Crashes(tmp)
    try:
        async with control_plane(tmp) as cp:
            d1 = crashes.start(cp.url, point)
            await cp.wait_connected(INSTANCE, timeout=30)
            counted = [cp.hello(INSTANCE)["last_command_seq"]]  # type: ignore[index]
            sent, died = await _workload(cp, d1, runs=4)
            assert died, f"{point}: the workload never reached the crash point"
            assert await d1.wait(10) == -9, "the crash point kills with SIGKILL"
            return await _recover_and_check(cp, crashes, sent, counted)
    finally:
        crashes.close()


async def random_kills(tmp: Path, kills: int, seed: int) -> dict[str, Any]:
    """SIGKILL at random moments under a flood (runs of fast steps), `kills` times in a row."""
    rng = random.Random(seed)
    crashes = Crashes(tmp)
    try:
        async with control_plane(tmp) as cp:
            counted: list[int] = []
            sent: list[str] = []
            for k in range(kills):
                d = crashes.start(cp.url)
                await cp.wait_connected(INSTANCE, timeout=30)
                counted.append(cp.hello(INSTANCE)["last_command_seq"])  # type: ignore[index]
                cid, _ = await cp.send_command(
                    INSTANCE, "input.start", run_id=f"run-k{k}", input={"text": f"[[flood:{STEPS}:0]]"}
                )
                sent.append(cid)
                await anyio.sleep(rng.uniform(0.0, 0.4))  # the fault itself: a kill at a random moment
                d.kill()
                await cp.wait_disconnected(INSTANCE, timeout=10)
            return await _recover_and_check(cp, crashes, sent, counted)
    finally:
        crashes.close()


@pytest.mark.parametrize("where", WHERES)
@pytest.mark.parametrize("what", WHATS)
async def test_crash_point(tmp_path: Path, what: str, where: str) -> None:
    summary = await crash_at(tmp_path, f"{what}.{where}:{SHORT_N[what]}")
    assert summary["runs"] >= 1


async def test_random_kills_under_a_flood(tmp_path: Path) -> None:
    summary = await random_kills(tmp_path, kills=3, seed=19)
    assert summary["runs"] >= 1


@pytest.mark.long
@pytest.mark.parametrize("where", WHERES)
@pytest.mark.parametrize("what", WHATS)
async def test_crash_point_long(tmp_path: Path, what: str, where: str) -> None:
    for n in LONG_N[what]:
        (tmp_path / f"n{n}").mkdir()
        await crash_at(tmp_path / f"n{n}", f"{what}.{where}:{n}")


@pytest.mark.long
@pytest.mark.parametrize("seed", range(5))
async def test_random_kills_under_a_flood_long(tmp_path: Path, seed: int) -> None:
    await random_kills(tmp_path, kills=8, seed=seed)
