"""The model proxy (PROTOCOL §6.7) across driver processes (§8.2), through the real driver and REAL
runtimes against the fake model endpoints: the session budget carried over a crash, the proxy's
address and placeholder kept for a reattached provider, and codex-acp's checkpoint under the proxy.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from agent_lab.testing.fakes import Fakes

from tests.integration.harness import INSTANCE, DriverProcess, control_plane
from tests.integration.test_model_proxy import end_tree, proxied_payload


@pytest.fixture(scope="module")
def fakes() -> Iterator[Fakes]:
    with ExitStack() as stack:
        yield Fakes(stack)


async def run_to_end(cp: Any, run_id: str, text: str) -> dict[str, Any]:
    cid, _ = await cp.send_command(INSTANCE, "input.start", run_id=run_id, input={"text": text})
    status: dict[str, Any] = await cp.wait_for_command_status(cid, timeout=90)
    return status


@pytest.mark.provider
async def test_a_crash_does_not_reset_the_session_budget(tmp_path: Path, fakes: Fakes) -> None:
    """Run 1 spends c under a large session budget; the driver is SIGKILLed. The successor, on the same
    state_dir with a session budget of 1.5 c, serves run 2 (c spent, below 1.5 c) and refuses run 3 (2 c
    spent). A ledger that started again from zero would have served run 3 too (c spent, below 1.5 c)."""
    driver: DriverProcess | None = None
    try:
        async with control_plane(tmp_path) as cp:
            first = proxied_payload("claude-agent-sdk", tmp_path, cp.url, fakes, budget={"max_usd_per_session": 100.0})
            driver = DriverProcess(tmp_path, first)
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=90)
            assert (await run_to_end(cp, "run-1", "[[say:one]]"))["status"] == "completed"
            spent = sum(e["payload"]["cost_usd"] for e in cp.events(INSTANCE, "model.usage"))
            assert spent > 0
            end_tree(driver)
            await cp.wait_disconnected(INSTANCE, timeout=10)

            budget = {"max_usd_per_session": 1.5 * spent}
            second = proxied_payload("claude-agent-sdk", tmp_path, cp.url, fakes, budget=budget)
            driver = DriverProcess(tmp_path, second, name="driver2")
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started" and e["epoch"] == 2, timeout=90)
            assert (await run_to_end(cp, "run-2", "[[say:two]]"))["status"] == "completed"
            status = await run_to_end(cp, "run-3", "[[say:three]]")
            assert status["status"] == "failed", json.dumps(status)
            error = cp.events(INSTANCE, "run.failed", run_id="run-3")[0]["payload"]["error"]
            assert (error["code"], error["details"]["limit"]) == ("budget.exceeded", "max_usd_per_session")
            assert error["details"]["spent"] >= 1.5 * spent
            assert [e["payload"]["run_id"] for e in cp.events(INSTANCE, "model.usage")] == ["run-1", "run-2"]
    finally:
        end_tree(driver)
