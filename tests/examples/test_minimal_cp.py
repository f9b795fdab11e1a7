"""examples/minimal_cp.py against the real driver (issue 35): a real runtime completes a turn through it,
and a driver SIGKILLed mid-run then restarted loses and doubles nothing.

The example is a script; tests/examples/minimal.py loads it. Its store is read directly (sqlite) and
through its HTTP API, as a control-plane author would.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from agent_lab.testing import agents
from agent_lab.testing.fakes import Fakes

from tests.examples.minimal import PATH, load
from tests.integration.harness import INSTANCE, TOKEN, DriverProcess, boot_payload
from tests.kernel import runtimes

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(240)]
TERMINALS = ("run.completed", "run.failed", "run.cancelled")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def drivers() -> Iterator[list[DriverProcess]]:
    started: list[DriverProcess] = []
    yield started
    for d in started:
        d.close()


@asynccontextmanager
async def minimal_cp(tmp: Path) -> AsyncIterator[Any]:
    async with load().MinimalCP(tmp / "cp.sqlite3", TOKEN, heartbeat_ms=500) as cp:
        yield cp


async def api(cp: Any, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    """The example's HTTP API, from a worker thread (its POST hands the command to this event loop)."""
    return await asyncio.to_thread(_api, cp, method, path, body)


def _api(cp: Any, method: str, path: str, body: dict[str, Any] | None) -> Any:
    request = urllib.request.Request(
        f"http://127.0.0.1:{cp.api_port}/api/instances/{INSTANCE}/{path}",
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())


def status(cp: Any, command_id: str) -> str | None:
    return next((c["status"] for c in cp.store.commands(INSTANCE) if c["command_id"] == command_id), None)


def kinds(cp: Any, run_id: str) -> list[str]:
    return [e["kind"] for e in cp.store.events(INSTANCE) if e["run_id"] == run_id]


def test_the_example_is_small_and_uses_only_the_standard_library_websockets_and_sqlite() -> None:
    text = PATH.read_text()
    assert len(text.splitlines()) <= 420
    imported = set(re.findall(r"^(?:from|import) (\w+)", text, re.M))
    assert imported - set(sys.stdlib_module_names) == {"websockets"}, imported


@pytest.mark.provider
async def test_a_claude_agent_sdk_turn_through_the_minimal_cp(tmp_path: Path, drivers: list[DriverProcess]) -> None:
    with ExitStack() as stack:
        fakes = Fakes(stack)
        async with minimal_cp(tmp_path) as cp:
            payload = runtimes.payload("claude-agent-sdk", tmp_path, cp.url, fakes)
            drivers.append(DriverProcess(tmp_path, payload))
            sent = await api(
                cp,
                "POST",
                "commands",
                {"kind": "input.start", "run_id": "run-1", "input": {"text": "[[say:Hi from the minimal CP]]"}},
            )
            await cp.wait_until(lambda: status(cp, sent["command_id"]) in ("completed", "failed", "cancelled"), 120)
            assert status(cp, sent["command_id"]) == "completed"
            events = (await api(cp, "GET", "events"))["events"]
            run = [e for e in events if e["run_id"] == "run-1"]
            assert [e["kind"] for e in run if e["kind"] in TERMINALS] == ["run.completed"]
            assert run[-1]["payload"]["final_message_text"] == "Hi from the minimal CP"
            assert [c["status"] for c in (await api(cp, "GET", "commands"))["commands"]] == ["completed"]
            assert cp.heartbeats[INSTANCE]["state"] in ("ready", "running")


def step(e: dict[str, Any]) -> int:
    m = re.fullmatch(r"step (\d+)", e["payload"]["entries"][0]["content"])
    assert m is not None
    return int(m.group(1))


async def test_a_driver_sigkilled_mid_run_then_restarted_loses_and_doubles_nothing(
    tmp_path: Path, drivers: list[DriverProcess]
) -> None:
    flood = [sys.executable, str(agents.FLOOD)]
    async with minimal_cp(tmp_path) as cp:
        drivers.append(DriverProcess(tmp_path, boot_payload(tmp_path, cp.url, acp_command=flood), "d1"))
        first = await cp.send_command(INSTANCE, "input.start", run_id="run-k", input={"text": "[[flood:2000:2]]"})
        plans = lambda: [step(e) for e in cp.store.events(INSTANCE) if e["kind"] == "plan.updated"]  # noqa: E731
        await cp.wait_until(lambda: len(plans()) >= 30, 60)
        drivers[0].kill()  # SIGKILL, mid-flood: some events journaled and unsent, some sent and unreceipted
        drivers.append(DriverProcess(tmp_path, boot_payload(tmp_path, cp.url, acp_command=flood), "d2"))
        await cp.wait_until(lambda: "run.failed" in kinds(cp, "run-k"), 60)
        again = await cp.send_command(INSTANCE, "input.start", run_id="run-2", input={"text": "[[flood:5]]"})
        await cp.wait_until(lambda: status(cp, again["command_id"]) == "completed", 60)

        events = cp.store.events(INSTANCE)
        assert {e["epoch"] for e in events} == {1, 2}
        # Stored once each: no event id and no lossless seq twice (the table's primary key is event_id;
        # a seq twice would be a driver that re-admitted an event under a new id).
        assert not [s for s, n in Counter(e["seq"] for e in events).items() if n > 1]
        run_k = [e for e in events if e["run_id"] == "run-k" and e["delivery"] == "lossless"]
        steps = [step(e) for e in run_k if e["kind"] == "plan.updated"]
        # Nothing journaled was lost: the steps stored are a prefix with no hole and no repeat.
        assert steps == list(range(len(steps))) and len(steps) >= 30
        assert [e["kind"] for e in run_k if e["kind"] in TERMINALS] == ["run.failed"]
        assert run_k[-1]["kind"] == "run.failed" and run_k[-1]["payload"]["error"]["code"] == "driver.restarted"
        assert [e["kind"] for e in run_k].count("run.started") == 1
        assert status(cp, first["command_id"]) == "failed"  # from the restarted driver's command.finished
        assert steps_of(cp, "run-2") == [0, 1, 2, 3, 4]


def steps_of(cp: Any, run_id: str) -> list[int]:
    return [step(e) for e in cp.store.events(INSTANCE) if e["kind"] == "plan.updated" and e["run_id"] == run_id]
