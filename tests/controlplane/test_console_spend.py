"""The console shows each run's spend from the model proxy's `model.usage` events (PROTOCOL §6.7): one
row per run, summed over its model requests, and the run's terminal row says what it spent. In a real
headless Chromium, from hand-written frames."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from agent_lab.controlplane import ControlPlane
from agent_lab.controlplane.cli import console_login_url
from agent_lab.controlplane.console import ConsoleConfig

from tests.controlplane.browser import chromium
from tests.controlplane.client import INSTANCE, TOKEN, batch, event, handshake, send

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

CONSOLE_TOKEN = "console-spend-token-0123"


@pytest.fixture
async def cp(tmp_path: Path) -> AsyncIterator[ControlPlane]:
    config = ConsoleConfig(token=CONSOLE_TOKEN)
    async with ControlPlane(
        tmp_path / "cp.db", tokens={TOKEN: {INSTANCE}}, close_timeout_s=1.0, console=config
    ) as plane:
        yield plane


def usage(run_id: str | None, cost: float | None, tokens: int) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "upstream": "https://api.anthropic.com",
        "model": "claude-sonnet-4-5",
        "input_tokens": tokens,
        "output_tokens": tokens // 10,
        "cached_input_tokens": 0,
        "cost_usd": cost,
        "request_id": f"req_{tokens}",
    }


async def test_each_run_shows_its_spend(cp: ControlPlane, tmp_path: Path) -> None:
    ws, _ = await handshake(cp.url)
    events = [
        event(1, "run.started"),
        event(2, "model.usage", run_id="run-1", payload=usage("run-1", 0.0125, 1000)),
        event(3, "model.usage", run_id="run-1", payload=usage("run-1", 0.0250, 2000)),
        event(4, "run.failed", payload={"error": {"code": "budget.exceeded", "message": "max_usd_per_run"}}),
        event(5, "run.started", run_id="run-2", payload={"run_id": "run-2", "revision": "r", "input_summary": "x"}),
        event(6, "model.usage", run_id="run-2", payload=usage("run-2", None, 300)),
    ]
    await send(ws, batch(1, events))
    await cp.wait_for_event(INSTANCE, lambda e: e["seq"] == 6)
    assert cp.http_url is not None
    url = console_login_url(cp, True)

    def look() -> dict[str, Any]:
        from selenium.webdriver.support.wait import WebDriverWait

        browser = chromium(tmp_path / "profile", tmp_path / "downloads")
        try:
            browser.get(url)
            rows = WebDriverWait(browser, 30).until(
                lambda b: (
                    len(b.find_elements("css selector", ".spend")) == 2 and b.find_elements("css selector", ".spend")
                )
            )
            failed = browser.find_element("css selector", ".terminal.run-failed")
            return {
                "rows": {r.get_attribute("data-run-id"): r.text for r in rows},
                "requests": {r.get_attribute("data-run-id"): r.get_attribute("data-requests") for r in rows},
                "failed": failed.text,
            }
        finally:
            browser.quit()

    seen = await asyncio.to_thread(look)
    await ws.close()
    assert "run-1: $0.0375 · 2 model request(s) · in 3000 · out 300" in seen["rows"]["run-1"]
    assert "run-2: $- · 1 model request(s)" in seen["rows"]["run-2"]  # an unpriced model
    assert seen["requests"] == {"run-1": "2", "run-2": "1"}
    assert "budget.exceeded" in seen["failed"] and "spent $0.0375" in seen["failed"]
