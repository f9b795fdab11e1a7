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

from driver.keeper import kept
from tests.faults.history import check_run
from tests.integration.harness import INSTANCE, DriverProcess, control_plane
from tests.integration.test_model_proxy import SECRET, end_tree, proxied_payload
from tests.kernel.support import Driver
from tests.kernel.test_reattach import FAST, alive, driver_key, provider_pid

__all__ = ["driver_key"]  # the autouse fixture: the keeper's files are read under the journal's key


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


def kept_proxied(runtime: str, tmp: Path, cp: Any, fakes: Fakes) -> dict[str, Any]:
    payload = proxied_payload(runtime, tmp, cp.url, fakes)
    payload["execution"]["reattach_grace_ms"] = 30_000
    return payload


# A run of two model requests with a tool call between them: the driver is killed while the tool runs.
SLOW_TOOL = "[[shell:sleep 4; echo slept]]"


@pytest.mark.provider
@pytest.mark.parametrize("runtime", ["openai-app-server"])
async def test_a_reattached_provider_keeps_calling_the_proxy(runtime: str, tmp_path: Path, fakes: Fakes) -> None:
    """The driver is SIGKILLed in a run under the proxy and a grace, while a tool runs between the
    run's two model requests: the successor listens on the port the kept provider calls and accepts the
    placeholder it holds, so the run's second model request goes through, the run ends once, and the
    next run's request goes through the proxy with the real key too (before: connection refused, the
    run failed while `reattach` was announced). A model stream in flight at the kill is cut with the
    proxy's process: not this test's case (docs/keeper.md)."""
    state = tmp_path / "state"
    async with control_plane(tmp_path) as cp:
        d = Driver(tmp_path, kept_proxied(runtime, tmp_path, cp, fakes), env=FAST)
        try:
            started = await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=90)
            assert {c["id"]: c["supported"] for c in started["payload"]["capabilities"]}["reattach"] is True
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": SLOW_TOOL})
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "tool.started", timeout=90)
            pid = provider_pid(state)
            before = len(fakes.responses.request_headers)
            d.kill()
            await cp.wait_disconnected(INSTANCE, timeout=10)
            assert alive(pid), "the provider died with its driver"
            d = Driver(tmp_path, kept_proxied(runtime, tmp_path, cp, fakes), name="driver2", env=FAST)
            status = await cp.wait_for_command_status(cid, timeout=120)
            assert status["status"] == "completed", json.dumps(status)
            check_run(cp, "run-1", terminal="run.completed")
            assert provider_pid(state) == pid, "not the kept provider"
            # The run's answer after the tool: asked of the successor's proxy, with the real key.
            headers = fakes.responses.request_headers[before:]
            assert headers and all(SECRET in h.get("authorization", "") for h in headers), headers
            usage = [e for e in cp.events(INSTANCE, "model.usage") if e["payload"]["run_id"] == "run-1"]
            assert [e["epoch"] for e in usage] == [1, 2], usage

            before = len(fakes.responses.request_headers)
            cid2, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-2", input={"text": "[[say:ok]]"})
            status2 = await cp.wait_for_command_status(cid2, timeout=90)
            assert status2["status"] == "completed", json.dumps(status2)
            assert provider_pid(state) == pid, "not the kept provider"
            headers = fakes.responses.request_headers[before:]
            assert headers and all(SECRET in h.get("authorization", "") for h in headers), headers
            assert [e for e in cp.events(INSTANCE, "model.usage") if e["payload"]["run_id"] == "run-2"]
            assert not cp.events(INSTANCE, "run.failed")
        finally:
            d.close()
            kept.discard(state)


@pytest.mark.provider
async def test_codex_acp_under_the_proxy_records_a_checkpoint(tmp_path: Path, fakes: Fakes) -> None:
    """codex-acp writes its session under the CODEX_HOME it is given, the proxy room's copy of the
    agent's: that copy links the agent's `sessions/` (made when missing), so the session file lands
    where the checkpoint recorder looks (before: in the copy, and no checkpoint was ever recorded)."""
    driver: DriverProcess | None = None
    try:
        async with control_plane(tmp_path) as cp:
            payload = proxied_payload("acp:codex-acp", tmp_path, cp.url, fakes)
            home = Path(payload["execution"]["acp"]["env"]["CODEX_HOME"])
            assert not (home / "sessions").exists()
            driver = DriverProcess(tmp_path, payload)
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=90)
            assert (await run_to_end(cp, "run-1", "[[say:kept]]"))["status"] == "completed"
            recorded = await cp.wait_for_event(
                INSTANCE, lambda e: e["kind"] == "checkpoint.recorded" and e["payload"]["run_id"] == "run-1", timeout=30
            )
            files = [f["path"] for f in recorded["payload"]["files"]]
            assert len(files) == 1 and files[0].startswith("sessions/") and files[0].endswith(".jsonl"), files
            assert (home / files[0]).is_file()
    finally:
        end_tree(driver)
