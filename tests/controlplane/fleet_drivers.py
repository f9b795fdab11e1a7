"""Real drivers in the fleet test (issue 34): the real `agent-driver run` process with a real runtime (our
stubborn ACP agent, and the Claude Agent SDK's CLI against the fake Anthropic endpoint), dialing the
gateways' shared port; and the database queries the test waits on (the gateways are other processes,
so the test reads what they stored, as any other gateway would)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import anyio
import asyncpg
from agent_lab.bench._common import TOKEN as GATEWAY_TOKEN
from agent_lab.controlplane.pg_store import PgEngine
from agent_lab.testing.fakes import Fakes

from tests.kernel import runtimes
from tests.kernel.support import Driver, children

RUN_TERMINALS = ("run.completed", "run.failed", "run.cancelled")


class RealDriver:
    """One real driver process for `instance`, running `runtime` ("acp:stubborn" or "claude-agent-sdk")."""

    def __init__(self, tmp: Path, url: str, instance: str, runtime: str, fakes: Fakes) -> None:
        self.instance = instance
        self.runtime = runtime
        self.run_id = f"run-{instance}"
        folder = tmp / instance
        folder.mkdir(parents=True)
        payload = runtimes.payload(runtime, folder, url, fakes)
        payload["driver_instance_id"] = instance
        payload["control"]["token"] = GATEWAY_TOKEN
        payload["session"]["id"] = f"ses-{instance}"
        self.process = Driver(folder, payload)

    def close(self) -> None:
        pids = children(self.process.pid)
        self.process.close()
        for pid in pids:  # a provider left behind must not outlive the test
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


async def start_runs(url: str, drivers: list[RealDriver], text: str) -> None:
    """Queue one `input.start` per driver, as another gateway would: stored with its NOTIFY, so the
    gateway holding the driver's link sends it."""
    engine = PgEngine(url, "fleet-test")
    await engine.start()
    try:
        for d in drivers:
            await engine.add_command(d.instance, "input.start", {"run_id": d.run_id, "input": {"text": text}}, None)
    finally:
        await engine.close()


async def wait_rows(db: asyncpg.Connection, sql: str, *args: Any, count: int, timeout: float) -> list[asyncpg.Record]:
    """The rows of `sql` once there are at least `count` of them (fails after `timeout` seconds)."""
    with anyio.fail_after(timeout):
        while True:
            rows = await db.fetch(sql, *args)
            if len(rows) >= count:
                return rows
            await anyio.sleep(0.05)  # polling another process's commits: there is no event to wait on


async def owners(db: asyncpg.Connection, instances: list[str]) -> dict[str, tuple[str, int]]:
    """instance -> (the gateway that claimed it last, its link generation)."""
    rows = await db.fetch(
        "SELECT instance_id, owner, link_generation FROM instances WHERE instance_id = ANY($1)", instances
    )
    return {r[0]: (r[1], int(r[2])) for r in rows}


async def watch_reclaims(
    db: asyncpg.Connection, before: dict[str, tuple[str, int]], seen: dict[str, float], timeout: float
) -> None:
    """Record when each instance in `before` is claimed again (its link generation moved on): the claim
    commits just before the welcome is sent."""
    with anyio.fail_after(timeout):
        while len(seen) < len(before):
            now = await owners(db, list(before))
            for instance, (_, generation) in now.items():
                if generation > before[instance][1] and instance not in seen:
                    seen[instance] = time.monotonic()
            await anyio.sleep(0.02)  # polling another process's commits: there is no event to wait on


def final_text(row: asyncpg.Record) -> str:
    return str(json.loads(row["payload"]).get("final_message_text") or "")
