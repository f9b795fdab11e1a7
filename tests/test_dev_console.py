"""`agent-driver dev` with its web console: the console URL beside the terminal chat, and the two in step.

The real `agent-driver dev` (real driver process, real Claude Code CLI on the offline fake endpoint) and
a real headless Chromium on the URL it prints: a line typed in the terminal shows in the browser, a
message sent from the browser shows in the terminal, and each reply shows in both.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from agent_lab.dev import AGENT_PREFIX, CONSOLE_PREFIX

from tests.controlplane.browser import chromium
from tests.test_dev import DEV, ROOT, Screen, dev_env

pytestmark = [pytest.mark.browser, pytest.mark.provider, pytest.mark.timeout(400)]


def _wait(browser: Any, condition: Any, what: str, timeout: float = 90) -> Any:
    from selenium.webdriver.support.wait import WebDriverWait

    return WebDriverWait(browser, timeout, ignored_exceptions=(Exception,)).until(condition, what)


def _click_until_noticed(browser: Any, selector: str, notice: str, tries: int = 3) -> None:
    """Click until the page's notice says the command was queued: a click that lands while the page
    re-renders its instance list can be lost (seen once), and a lost click is not what is tested."""
    from selenium.common.exceptions import TimeoutException

    for _ in range(tries):
        browser.find_element("css selector", selector).click()
        try:
            _wait(browser, lambda b: notice in b.find_element("css selector", "#notice").text, notice, timeout=15)
            return
        except TimeoutException:
            continue
    raise AssertionError(f"{selector}: the page never said {notice!r}")


def _texts(browser: Any, selector: str) -> list[str]:
    return [e.text for e in browser.find_elements("css selector", selector)]


def _type_in_browser(browser: Any, text: str) -> None:
    from selenium.webdriver.common.keys import Keys

    box = _wait(browser, lambda b: b.find_element("css selector", "#input-text"), "the message box")
    box.send_keys(text + Keys.ENTER)


async def test_dev_prints_the_console_url_and_both_views_stay_in_step(tmp_path: Path) -> None:
    workdir = tmp_path / "dev"
    proc = await asyncio.create_subprocess_exec(
        *DEV, "--workdir", str(workdir),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env=dev_env(), cwd=ROOT,
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    screen = Screen(proc.stdout)
    browser = None

    async def type_line(text: str) -> None:
        assert proc.stdin is not None
        proc.stdin.write(text.encode() + b"\n")
        await proc.stdin.drain()

    try:
        line = await screen.line_with("console (web, in step with this chat): ", 60)
        url = line.rsplit(" ", 1)[1]
        assert url.startswith("http://127.0.0.1:") and "/?login=" in url  # a one-time code, not the token
        await screen.wait_for("[driver] ready", 120)
        browser = await asyncio.to_thread(chromium, tmp_path / "profile", tmp_path / "downloads")
        await asyncio.to_thread(browser.get, url)  # the login link: sets the cookie, lands on the page
        await asyncio.to_thread(_wait, browser, lambda b: "login=" not in b.current_url, "the redirect to /")
        await asyncio.to_thread(
            _wait, browser, lambda b: b.find_elements("css selector", '#link-state[data-link="connected"]'), "connected"
        )

        # Typed in the terminal: the browser shows the input and the settled reply.
        await type_line("[[say:from the terminal]]")
        assert await screen.line_with(AGENT_PREFIX) == AGENT_PREFIX + "from the terminal"
        await asyncio.to_thread(
            _wait,
            browser,
            lambda b: "[[say:from the terminal]]" in _texts(b, ".user-input .text")
            and "from the terminal" in _texts(b, '.message[data-state="settled"] .text'),
            "the terminal's input and reply in the browser",
        )
        assert (await screen.line_with("[status]")).endswith("completed")

        # Sent from the browser: the terminal shows it, then the reply, then the run's end.
        await asyncio.to_thread(_type_in_browser, browser, "[[say:from the browser]]")
        assert await screen.line_with(CONSOLE_PREFIX) == CONSOLE_PREFIX + "[[say:from the browser]]"
        assert await screen.line_with(AGENT_PREFIX) == AGENT_PREFIX + "from the browser"
        assert (await screen.line_with("[status]")).endswith("completed")
        await asyncio.to_thread(
            _wait,
            browser,
            lambda b: "from the browser" in _texts(b, '.message[data-state="settled"] .text'),
            "the browser's reply in the browser",
        )
        await asyncio.to_thread(browser.save_screenshot, str(tmp_path / "dev-console.png"))

        # Asked in the terminal, answered in the browser: the terminal stops asking and says so.
        await type_line("[[write:from-dev.txt:made in step]]")
        await screen.wait_for("[permission] the agent asks:")
        allow = await asyncio.to_thread(
            _wait, browser, lambda b: b.find_elements("css selector", '.permission[data-outcome="pending"] .allow')[-1],
            "the permission in the browser",
        )  # fmt: skip
        await asyncio.to_thread(allow.click)
        assert await screen.line_with("[permission] allowed in the console") == "[permission] allowed in the console"
        assert (await screen.line_with("[status]")).endswith("completed")
        assert (workdir / "workspace" / "from-dev.txt").read_text() == "made in step"

        # The banner's link is used: opened again, the login page says how to get a new one; /link in
        # the chat prints a fresh one-time link that logs in (the console's token lives in memory only).
        await asyncio.to_thread(browser.delete_all_cookies)
        await asyncio.to_thread(browser.get, url)
        hint = await asyncio.to_thread(
            _wait, browser, lambda b: b.find_element("css selector", "p.hint").text, "the login page's hint"
        )
        assert "was used already" in browser.find_element("css selector", "p.error").text
        assert "/link" in hint
        await type_line("/link")
        fresh = (await screen.line_with("[dev] console login link (works once): ", 30)).rsplit(" ", 1)[1]
        assert fresh != url and "/?login=" in fresh
        await asyncio.to_thread(browser.get, fresh)
        await asyncio.to_thread(
            _wait, browser, lambda b: b.find_elements("css selector", '#link-state[data-link="connected"]'), "in again"
        )

        # Stopped from the browser: the terminal says so and ends cleanly.
        await asyncio.to_thread(_click_until_noticed, browser, "#stop-driver", "session.stop queued")
        await screen.wait_for("[console] session.stop: the driver is stopping")
        await screen.wait_for("[dev] the driver stopped cleanly")
        async with asyncio.timeout(30):
            assert await proc.wait() == 0
    finally:
        if browser is not None:
            await asyncio.to_thread(browser.quit)
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
