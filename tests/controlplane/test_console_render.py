"""How the page renders what the store holds, from hand-written frames (no provider): folded thoughts,
a reply whose late deltas lose to its completed text, diagnostics, files, a failed run, the driver's log lines,
the heartbeat's state, outbox and activity, and raw JSON opened with the keyboard. In a real headless Chromium."""

from __future__ import annotations

import asyncio
import json
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

CONSOLE_TOKEN = "console-render-token-0123"


@pytest.fixture
async def cp(tmp_path: Path) -> AsyncIterator[ControlPlane]:
    config = ConsoleConfig(token=CONSOLE_TOKEN)
    async with ControlPlane(
        tmp_path / "cp.db", tokens={TOKEN: {INSTANCE}}, close_timeout_s=1.0, console=config
    ) as plane:
        yield plane


def _until(browser: Any, condition: Any, what: str) -> Any:
    from selenium.webdriver.support.wait import WebDriverWait

    return WebDriverWait(browser, 30, ignored_exceptions=(Exception,)).until(condition, what)


def _one(browser: Any, selector: str) -> Any:
    return _until(browser, lambda b: b.find_elements("css selector", selector)[-1], selector)


async def test_the_page_renders_each_kind_from_the_store(cp: ControlPlane, tmp_path: Path) -> None:
    ws, _ = await handshake(cp.url)
    run = "run-1"
    events = [
        event(1, "run.started"),
        event(2, "thought.started", payload={"thought_id": "th-1"}),
        event(3, "thought.delta", payload={"thought_id": "th-1", "text": "pondering"}),
        event(4, "thought.completed", payload={"thought_id": "th-1", "text": "pondering deeply"}),
        event(5, "message.started", payload={"message_id": "msg-1", "role": "assistant"}),
        event(6, "message.completed", payload={"message_id": "msg-1", "role": "assistant", "text": "the whole reply"}),
        # A best-effort delta stored after its completed message: the completed text stays.
        event(7, "message.delta", payload={"message_id": "msg-1", "text": " stale tail"}),
        event(8, "file.changed", payload={"path": "src/app.py", "change": "modified", "sha256": "ab" * 32}),
        event(
            9,
            "diagnostic.reported",
            payload={"code": "skill.failed", "severity": "warning", "message": "skill x: bad hash", "details": {}},
        ),
        event(10, "run.failed", payload={"error": {"code": "provider.crashed", "message": "exit 9"}}),
        event(
            11,
            "log.records",
            run_id=None,
            delivery="best_effort",
            payload={
                "records": [
                    {"at": "2026-11-29T10:00:02Z", "level": "info", "logger": "agent_driver.link", "message": "up"},
                    {"at": "2026-11-29T10:00:03Z", "level": "warning", "logger": "agent_driver", "message": "slow"},
                ],
                "dropped": 4,
            },
        ),
    ]
    await send(ws, batch(1, events))
    beat = {
        "type": "heartbeat",
        "at": "2026-11-29T10:00:05.000Z",
        "state": "running",
        "run_id": run,
        "outbox": {"lossless_pending": 3, "best_effort_dropped": 17},
        "activity": {"provider_pid": 812, "provider_rss_mb": 412.5, "tool_call_id": None},
    }
    await cp.wait_for_event(INSTANCE, lambda e: e["seq"] == 11)
    await send(ws, beat)
    await cp.wait_until(lambda: cp.last_heartbeat(INSTANCE) is not None)
    assert cp.http_url is not None
    url = console_login_url(cp, True)

    def look() -> dict[str, Any]:
        from selenium.webdriver.common.keys import Keys

        browser = chromium(tmp_path / "profile", tmp_path / "downloads")
        try:
            browser.get(url)
            # The session's line, and the heartbeat's figures (folded under Diagnostics: textContent).
            diagnostics = _until(
                browser, lambda b: "412.5" in (t := b.find_element("css selector", "#diagnostic-fields")
                .get_attribute("textContent")) and t, "the heartbeat's activity"
            )  # fmt: skip
            fields = browser.find_element("css selector", "#summary-fields").text + "\n" + diagnostics
            failed = _one(browser, ".terminal.run-failed")
            thought = _one(browser, "details.thought")
            message = _one(browser, ".message")
            raw = message.find_element("css selector", "details.raw summary")
            # Keyboard only: Tab reaches the raw JSON's summary, Enter opens it.
            browser.execute_script("arguments[0].focus()", browser.find_element("css selector", "#stream-state"))
            active = browser.switch_to.active_element
            for _ in range(200):
                if active == raw:
                    break
                active.send_keys(Keys.TAB)
                active = browser.switch_to.active_element
            active.send_keys(Keys.ENTER)
            opened = message.find_element("css selector", "details.raw").get_attribute("open") is not None
            raw_json = message.find_element("css selector", "details.raw pre").get_attribute("textContent")
            return {
                "fields": fields,
                "failed": failed.text,
                "thought_open": thought.get_attribute("open") is not None,
                "thought_text": thought.find_element("css selector", ".text").get_attribute("textContent"),
                "message": message.find_element("css selector", ".text").text,
                "message_state": message.get_attribute("data-state"),
                "focused_raw": active == raw,
                "opened": opened,
                "raw": json.loads(raw_json),
                "file": _one(browser, '.ev[data-kind="file.changed"]').text,
                "diagnostic": _one(browser, '.ev[data-kind="diagnostic.reported"]').text,
                "log": _one(browser, '.ev[data-kind="log.records"]').get_attribute("textContent"),
                "shot": browser.save_screenshot(str(tmp_path / "render.png")),
            }
        finally:
            browser.quit()

    seen = await asyncio.to_thread(look)
    await ws.close()
    assert "provider.crashed: exit 9" in seen["failed"]
    assert not seen["thought_open"] and seen["thought_text"] == "pondering deeply"  # folded, settled
    assert (seen["message"], seen["message_state"]) == ("the whole reply", "settled")
    assert seen["focused_raw"] and seen["opened"]
    assert {k: seen["raw"][k] for k in ("event_id", "seq", "epoch", "delivery")} == {
        "event_id": f"{INSTANCE}/1/000005",
        "seq": 5,
        "epoch": 1,
        "delivery": "lossless",
    }
    assert "modified src/app.py" in seen["file"]
    assert "[warning] skill.failed: skill x: bad hash" in seen["diagnostic"]
    assert "2 driver log line(s), 4 dropped before them" in seen["log"]
    assert "warning agent_driver: slow" in seen["log"]
    for shown in ("running", "run-1", "3", "17", "provider_pid=812, provider_rss_mb=412.5"):
        assert shown in seen["fields"]
    assert seen["shot"]


async def test_each_checkpoint_is_one_row_and_its_chunks_stay_out(cp: ControlPlane, tmp_path: Path) -> None:
    """PROTOCOL §8.1 in the console: a checkpoint's manifest is one row (run, files, bytes, session); the
    chunks carry base64 of the session files and get no row; a reset that names its reason shows it."""
    from driver.checkpoints import chunks

    ws, _ = await handshake(cp.url)
    data = b'{"type": "user"}\n' * 100
    path = "sessions/2026/12/01/rollout-x-thr-9.jsonl"
    pieces = chunks.file_chunks("ckpt-abc", path, data, 0, 1024)
    manifest = chunks.manifest("ckpt-abc", "run-1", "openai-app-server", "thr-9", {path: data})
    events = [event(1, "run.started")]
    events += [event(2 + i, "checkpoint.file", run_id=None, payload=p) for i, p in enumerate(pieces)]
    n = 2 + len(pieces)
    events.append(event(n, "checkpoint.recorded", run_id=None, payload=manifest))
    reset = {"previous": "thr-0", "current": "thr-9", "reason": "checkpoint.hash_mismatch: x: sha256 does not match"}
    events.append(event(n + 1, "runtime.session.reset", run_id=None, payload=reset))
    await send(ws, batch(1, events))
    await cp.wait_for_event(INSTANCE, lambda e: e["seq"] == n + 1)
    assert cp.http_url is not None
    url = console_login_url(cp, True)

    def look() -> dict[str, Any]:
        browser = chromium(tmp_path / "profile", tmp_path / "downloads")
        try:
            browser.get(url)
            row = _one(browser, '.ev[data-kind="checkpoint.recorded"]')
            return {
                "checkpoint": row.text,
                "reset": _one(browser, '.ev[data-kind="runtime.session.reset"]').text,
                "chunks": len(browser.find_elements("css selector", '.ev[data-kind="checkpoint.file"]')),
            }
        finally:
            browser.quit()

    seen = await asyncio.to_thread(look)
    await ws.close()
    assert "ckpt-abc" in seen["checkpoint"] and f"{len(data)} bytes" in seen["checkpoint"]
    assert "after run-1" in seen["checkpoint"] and "thr-9" in seen["checkpoint"]
    assert seen["chunks"] == 0
    assert "checkpoint.hash_mismatch" in seen["reset"]
