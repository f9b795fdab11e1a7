"""The console shows the conversation first (issue 35), in a real headless Chromium at 1400x900, from
hand-written frames (no provider): a run with heartbeat activity, timing, log and diagnostic cards, a
finished run's terminal state and a pending permission prompt. The prompt's Allow/Deny and the terminal
state are in the viewport, the noise is folded (and opens), and the prompt does not move while
heartbeats and new rows arrive — a prompt that moved under the pointer between a click's aim and its
press is why a Deny click was intermittently lost (issue 30): the click then declines the request."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from agent_lab.controlplane import ControlPlane
from agent_lab.controlplane.cli import console_login_url
from agent_lab.controlplane.console import ConsoleConfig

from tests.controlplane.browser import chromium
from tests.controlplane.client import INSTANCE, TOKEN, batch, event, handshake, send

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

WIDTH, HEIGHT = 1400, 900
OPTIONS = [
    {"option_id": "allow-1", "kind": "allow_once", "label": "Allow"},
    {"option_id": "reject-1", "kind": "reject_once", "label": "Deny"},
]


@pytest.fixture
async def cp(tmp_path: Path) -> AsyncIterator[ControlPlane]:
    config = ConsoleConfig(token="console-layout-token-0123")
    async with ControlPlane(
        tmp_path / "cp.db", tokens={TOKEN: {INSTANCE}}, close_timeout_s=1.0, console=config
    ) as plane:
        yield plane


def noisy_run(first_seq: int, run_id: str, cards: int) -> list[dict[str, Any]]:
    """One run's events with the cards that used to crowd the timeline: timings, log lines, diagnostics."""
    seq = first_seq
    out: list[dict[str, Any]] = []

    def add(kind: str, payload: dict[str, Any], run: str | None = run_id, delivery: str | None = None) -> None:
        nonlocal seq
        out.append(event(seq, kind, run_id=run, payload=payload, delivery=delivery))
        seq += 1

    add("run.started", {"run_id": run_id, "revision": "rev-1", "input_summary": "write the notes"})
    for i in range(cards):
        add("runtime.timing.recorded", {"phase": "provider.ready", "ms": 812.5 + i, "mode": "cold"}, None)
        add("diagnostic.reported", {"code": "provider.slow", "severity": "warning", "message": f"slow {i}"})
        records = [{"at": "2026-11-29T10:00:02Z", "level": "info", "logger": "driver.link", "message": f"line {i}"}]
        add("log.records", {"records": records, "dropped": 0}, None, "best_effort")
    add("message.started", {"message_id": f"m-{run_id}", "role": "assistant"})
    add("message.completed", {"message_id": f"m-{run_id}", "role": "assistant", "text": f"Working on {run_id}."})
    tool = f"tool-{run_id}"
    add("tool.started", {"tool_call_id": tool, "name": "Write", "title": "notes.txt", "input": {"path": "notes.txt"}})
    return out


def permission(seq: int, run_id: str, request_id: str) -> dict[str, Any]:
    payload = {
        "request_id": request_id,
        "tool_call_id": f"tool-{run_id}",
        "title": "Write: notes.txt",
        "options": OPTIONS,
        "expires_at": (datetime.now(UTC) + timedelta(seconds=60)).isoformat().replace("+00:00", "Z"),
    }
    return event(seq, "permission.requested", run_id=run_id, payload=payload)


def heartbeat(full: bool) -> dict[str, Any]:
    """A heartbeat; `full`: every activity field (PROTOCOL §2.5), as a busy provider reports them."""
    activity: dict[str, Any] = {"provider_pid": 812, "provider_rss_mb": 412.5}
    if full:
        activity |= {"provider_cpu_ms": 10_904, "provider_processes": 3, "last_provider_output_ms_ago": 13,
                     "tool_call_id": "toolu_fake_756439dbef19474bbe64", "tool_running_ms": 1_234}  # fmt: skip
    return {
        "type": "heartbeat",
        "at": "2026-11-29T10:00:05.000Z",
        "state": "waiting_permission",
        "run_id": "run-2",
        "outbox": {"lossless_pending": 0, "best_effort_dropped": 0},
        "activity": activity,
    }


IN_VIEW = """
const r = arguments[0].getBoundingClientRect();
const x = r.left + r.width / 2, y = r.top + r.height / 2;
const hit = document.elementFromPoint(x, y);
return {top: r.top, bottom: r.bottom, left: r.left, right: r.right,
        visible: r.top >= 0 && r.left >= 0 && r.bottom <= innerHeight && r.right <= innerWidth,
        hit: hit === arguments[0] || arguments[0].contains(hit)};
"""


async def test_the_conversation_is_in_view_and_the_prompt_holds_still(cp: ControlPlane, tmp_path: Path) -> None:
    ws, _ = await handshake(cp.url)
    # run-1: the noisy run, its prompt answered, then its terminal state; run-2: asking now.
    first = noisy_run(1, "run-1", cards=6)
    n = len(first) + 1
    first.append(permission(n, "run-1", "perm-1"))
    resolved = {"request_id": "perm-1", "outcome": "rejected", "option_id": "reject-1", "decided_by": "control_plane"}
    first.append(event(n + 1, "permission.resolved", run_id="run-1", payload=resolved))
    first.append(
        event(n + 2, "run.cancelled", run_id="run-1", payload={"reason": "stop", "requested_by": "control_plane"})
    )
    second = noisy_run(n + 3, "run-2", cards=1)
    last = n + 3 + len(second)
    second.append(permission(last, "run-2", "perm-2"))
    await send(ws, batch(1, first + second))
    await cp.wait_for_event(INSTANCE, lambda e: e["seq"] == last)
    await send(ws, heartbeat(False))
    await cp.wait_until(lambda: cp.last_heartbeat(INSTANCE) is not None)
    url = console_login_url(cp, True)
    loop = asyncio.get_running_loop()

    def in_loop(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout=30)

    def look() -> dict[str, Any]:
        from selenium.webdriver.support.wait import WebDriverWait

        browser = chromium(tmp_path / "profile", tmp_path / "downloads", WIDTH, HEIGHT)

        def until(condition: Any, what: str) -> Any:
            return WebDriverWait(browser, 30, ignored_exceptions=(Exception,)).until(condition, what)

        def one(selector: str) -> Any:
            return until(lambda b: b.find_elements("css selector", selector)[-1], selector)

        try:
            browser.get(url)
            deny = one('.permission[data-request-id="perm-2"][data-outcome="pending"] .deny')
            allow = one('.permission[data-request-id="perm-2"] .allow')
            until(
                lambda b: "provider_pid=812" in one('dd[data-field="activity"]').get_attribute("textContent"),
                "activity",
            )
            cancelled = one('.terminal[data-run-id="run-1"]')
            seen: dict[str, Any] = {
                "deny": browser.execute_script(IN_VIEW, deny),
                "allow": browser.execute_script(IN_VIEW, allow),
                "cancelled": browser.execute_script(IN_VIEW, cancelled),
                "folded": {
                    kind: [
                        d.get_attribute("open")
                        for d in browser.find_elements("css selector", f'.ev[data-kind="{kind}"]')
                    ]
                    for kind in ("runtime.timing.recorded", "diagnostic.reported", "log.records")
                },
                "diagnostics_open": one("#diagnostics").get_attribute("open"),
            }
            browser.save_screenshot(str(tmp_path / "layout.png"))
            # Opening a folded card shows the whole event.
            timing = one('.ev[data-kind="runtime.timing.recorded"] > summary')
            browser.execute_script("arguments[0].scrollIntoView()", timing)
            timing.click()
            seen["opened"] = one('.ev[data-kind="runtime.timing.recorded"][open] .raw-json').text
            one("#diagnostics > summary").click()
            seen["activity_shown"] = one('dd[data-field="activity"]').text
            one("#diagnostics > summary").click()  # folded again: the page as it was
            browser.execute_script("document.getElementById('timeline').scrollTop = 1e9")
            # While the prompt waits: a heartbeat whose activity is much longer, and more rows.
            before = browser.execute_script(IN_VIEW, deny)
            in_loop(send(ws, heartbeat(True)))
            until(
                lambda b: "tool_running_ms=1234" in one('dd[data-field="activity"]').get_attribute("textContent"),
                "the new activity",
            )
            more = [event(last + 1 + i, "diagnostic.reported", payload={"code": "late", "severity": "info",
                    "message": f"late {i}"}) for i in range(8)]  # fmt: skip
            in_loop(send(ws, batch(2, more)))
            until(lambda b: b.find_elements("css selector", f'.ev[data-event-id="{more[-1]["event_id"]}"]'), "the rows")
            seen["before"], seen["after"] = before, browser.execute_script(IN_VIEW, deny)
            deny.click()
            notice = lambda b: b.find_element("css selector", "#notice").text  # noqa: E731
            seen["notice"] = until(lambda b: "permission.resolve queued" in notice(b) and notice(b), "the command")
            return seen
        finally:
            browser.quit()

    seen = await asyncio.to_thread(look)
    await ws.close()
    for name in ("deny", "allow", "cancelled"):
        assert seen[name]["visible"] and seen[name]["hit"], (name, seen[name])
    for kind, opens in seen["folded"].items():
        assert opens and all(o is None for o in opens), kind  # folded by default
    assert seen["diagnostics_open"] is None
    assert '"phase": "provider.ready"' in seen["opened"]
    assert "provider_pid=812" in seen["activity_shown"]
    # Nothing that arrived while the prompt waited moved it.
    assert (seen["after"]["top"], seen["after"]["left"]) == (seen["before"]["top"], seen["before"]["left"])
    assert seen["after"]["hit"]
    (resolve,) = [c for c in cp.store.commands(INSTANCE) if c["kind"] == "permission.resolve"]
    assert resolve["body"]["request_id"] == "perm-2" and resolve["body"]["option_id"] == "reject-1"
