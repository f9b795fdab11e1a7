"""The console's terminals (PROTOCOL §6.8) in a real headless Chromium: xterm.js served from
node_modules by the reference control plane (its own process), the real driver process beside it (the
stubborn ACP agent: no model needed). One session for the module, its steps in order: open a shell, type
a command and see its output, reload and see the same screen, resize the window and see `stty size`
follow, and the control plane killed while the shell writes, then the exact catch-up through
process.replay once it is back."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.controlplane.browser import ControlPlaneProcess, chromium, viewport
from tests.integration.harness import INSTANCE, TOKEN, DriverProcess, boot_payload

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

WAIT_S = 60.0


@dataclass
class Page:
    cp: ControlPlaneProcess
    driver: DriverProcess
    browser: Any
    tmp: Path

    def wait(self, condition: Any, what: str, timeout: float = WAIT_S) -> Any:
        from selenium.webdriver.support.wait import WebDriverWait

        return WebDriverWait(self.browser, timeout, ignored_exceptions=(Exception,)).until(condition, what)

    def css(self, selector: str) -> list[Any]:
        from selenium.webdriver.common.by import By

        return list(self.browser.find_elements(By.CSS_SELECTOR, selector))

    def one(self, selector: str) -> Any:
        return self.wait(lambda _: (self.css(selector) or [None])[-1], f"an element {selector}")

    def js(self, script: str, *args: Any) -> Any:
        return self.browser.execute_script(script, *args)

    def screen(self, process_id: str) -> str:
        return str(self.js("return window.agentTerminals.panes.get(arguments[0]).text()", process_id))

    def type(self, process_id: str, text: str) -> None:
        box = self.one(f'.term-pane[data-process-id="{process_id}"] .xterm-helper-textarea')
        box.send_keys(text)

    def until_screen(self, process_id: str, needle: str) -> str:
        try:
            self.wait(lambda _: needle in self.screen(process_id), f"{needle!r} on the terminal")
        except Exception:
            raise AssertionError(f"{needle!r} not on the terminal: {self.screen(process_id)!r}") from None
        return self.screen(process_id)


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Page]:
    tmp = tmp_path_factory.mktemp("terminals")
    with ExitStack() as stack:
        cp = ControlPlaneProcess(tmp, TOKEN, INSTANCE, tmp / "cwd")
        stack.callback(cp.kill)
        cp.start()
        driver = DriverProcess(tmp, boot_payload(tmp, cp.url))
        stack.callback(driver.close)
        browser = chromium(tmp / "profile", tmp / "downloads", width=1200, height=900)
        stack.callback(browser.quit)
        browser.get(cp.console_url)
        yield Page(cp, driver, browser, tmp)


def _shell(page: Page) -> str:
    pane = page.one('.term-pane[data-state="running"]')
    return str(pane.get_attribute("data-process-id"))


def test_open_a_shell_type_and_see_the_output(page: Page) -> None:
    page.one("#token").send_keys(page.cp.console_token_file.read_text().strip() + "\n")
    page.one('#link-state[data-link="connected"]')
    page.one("#open-shell").click()
    pid = _shell(page)
    started = page.cp.events("process.started")
    assert started[-1]["payload"]["process_id"] == pid and started[-1]["payload"]["argv"][-1] == "-l"
    page.type(pid, "echo typed-$((40+2))\n")
    page.until_screen(pid, "typed-42")
    # What was typed went as process.input commands, in order, and completed.
    inputs = [c for c in page.cp.api(f"/api/instances/{INSTANCE}/commands")["commands"] if c["kind"] == "process.input"]
    assert (
        inputs and "".join(c["body"]["data"] for c in inputs) == "echo typed-$((40+2))\r"
    )  # Enter is CR on a terminal
    page.wait(
        lambda _: all(
            c["status"] == "completed"
            for c in page.cp.api(f"/api/instances/{INSTANCE}/commands")["commands"]
            if c["kind"] == "process.input"
        ),
        "inputs completed",
    )


def test_a_reload_shows_the_same_screen(page: Page) -> None:
    pid = _shell(page)
    page.type(pid, "seq 1 30 | tr '\\n' ' '; echo end-of-seq\n")
    before = page.until_screen(pid, "end-of-seq\n")
    page.browser.refresh()
    page.one(f'.term-pane[data-process-id="{pid}"]')
    page.wait(lambda _: page.screen(pid) == before, "the same screen after the reload")
    assert page.browser.save_screenshot(str(page.tmp / "terminal-after-reload.png"))


def test_the_terminal_follows_the_window_size(page: Page) -> None:
    pid = _shell(page)
    viewport(page.browser, 900, 900)
    page.js("window.dispatchEvent(new Event('resize'))")
    page.wait(
        lambda _: any(
            c["kind"] == "process.resize"
            and c["body"]["cols"] == page.js(f"return window.agentTerminals.panes.get('{pid}').term.cols")
            for c in page.cp.api(f"/api/instances/{INSTANCE}/commands")["commands"]
        ),
        "a process.resize to the new width",
    )
    cols = page.js(f"return window.agentTerminals.panes.get('{pid}').term.cols")
    rows = page.js(f"return window.agentTerminals.panes.get('{pid}').term.rows")
    page.type(pid, "stty size\n")
    page.until_screen(pid, f"{rows} {cols}")


def test_a_control_plane_outage_is_caught_up_exactly(page: Page) -> None:
    pid = _shell(page)
    # In cwd: the boot file's folder is hidden from the shell's tree (PROTOCOL §9).
    go, done = page.tmp / "cwd" / "go.fifo", page.tmp / "cwd" / "done.fifo"
    os.mkfifo(go)
    os.mkfifo(done)
    page.type(pid, f"cat {go}; seq 1 400 | tr '\\n' ' '; echo caught-up; echo x > {done}\n")
    page.until_screen(pid, "caught-up; echo")  # the command line itself, echoed
    page.cp.kill()  # no store, no link: what the shell writes now reaches nobody
    reader = os.open(done, os.O_RDONLY | os.O_NONBLOCK)
    try:
        os.close(os.open(go, os.O_WRONLY))
        page.wait(lambda _: os.read(reader, 4) == b"x\n", "the shell wrote its output")
    finally:
        os.close(reader)
    assert "caught-up\n" not in page.screen(pid)
    page.cp.start()
    screen = page.until_screen(pid, "caught-up\n")
    numbers = " ".join(str(i) for i in range(1, 401))
    assert numbers in screen.replace("\n", "")
    replays = [
        c for c in page.cp.api(f"/api/instances/{INSTANCE}/commands")["commands"] if c["kind"] == "process.replay"
    ]
    assert replays
