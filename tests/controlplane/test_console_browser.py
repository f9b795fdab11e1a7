"""The web console in a real headless Chromium, against the real driver process running the real Claude
Code CLI on the fake Anthropic endpoint, with the reference control plane as its own process.

One session for the module, its steps in order (each leaves a screenshot in the pytest temporary folder):
log in, a reply streams then settles, a permission allowed and one denied, a slow run cancelled, an
artifact downloaded, and the link killed (driver frozen, then the control plane itself killed and
restarted) with the timeline complete afterwards.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.controlplane.browser import ControlPlaneProcess, chromium, viewport
from tests.integration.harness import INSTANCE, TOKEN, DriverProcess
from tests.kernel.runtimes import Fakes, payload

pytestmark = [pytest.mark.browser, pytest.mark.provider, pytest.mark.timeout(300)]

WAIT_S = 90.0


@dataclass
class Console:
    cp: ControlPlaneProcess
    driver: DriverProcess
    browser: Any
    shots: Path
    downloads: Path
    cwd: Path
    fakes: Fakes

    def shot(self, name: str) -> Path:
        path = self.shots / f"{name}.png"
        assert self.browser.save_screenshot(str(path))
        return path

    def wait(self, condition: Any, what: str, timeout: float = WAIT_S) -> Any:
        from selenium.webdriver.support.wait import WebDriverWait

        return WebDriverWait(self.browser, timeout, ignored_exceptions=(Exception,)).until(condition, what)

    def css(self, selector: str) -> list[Any]:
        from selenium.webdriver.common.by import By

        return list(self.browser.find_elements(By.CSS_SELECTOR, selector))

    def one(self, selector: str, timeout: float = WAIT_S) -> Any:
        return self.wait(lambda _: (self.css(selector) or [None])[-1], f"an element {selector}", timeout)

    def send(self, text: str) -> str:
        """Type a message and press Enter; the run id of the input.start it queued."""
        from selenium.webdriver.common.keys import Keys

        before = len(self.cp.api(f"/api/instances/{INSTANCE}/commands")["commands"])
        box = self.one("#input-text")
        box.send_keys(text)
        box.send_keys(Keys.ENTER)

        def queued(_: Any) -> str | None:
            commands = self.cp.api(f"/api/instances/{INSTANCE}/commands")["commands"]
            return str(commands[-1]["body"]["run_id"]) if len(commands) > before else None

        run_id = self.wait(queued, "the input.start command")
        self.wait(lambda _: self.css(".user-input .text")[-1].text == text, "the input on the timeline")
        return str(run_id)

    def terminal(self, run_id: str) -> Any:
        return self.one(f'.terminal[data-run-id="{run_id}"]')


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    tmp = tmp_path_factory.mktemp("console")
    (tmp / "downloads").mkdir()
    (tmp / "shots").mkdir()
    with ExitStack() as stack:
        fakes = Fakes(stack)
        cwd = tmp / "cwd"
        cwd.mkdir()
        cp = ControlPlaneProcess(tmp, TOKEN, INSTANCE, cwd)
        stack.callback(cp.kill)
        cp.start()
        boot = payload("claude-agent-sdk", tmp, cp.url, fakes)
        schema = {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}
        boot["execution"]["host_tools"] = [{"name": "lookup", "description": "A record by id", "input_schema": schema}]
        driver = DriverProcess(tmp, boot)
        stack.callback(driver.close)
        browser = chromium(tmp / "profile", tmp / "downloads")
        stack.callback(browser.quit)
        yield Console(cp, driver, browser, tmp / "shots", tmp / "downloads", cwd, fakes)


def test_login_shows_the_instance_connected(console: Console) -> None:
    assert "?token=" not in console.cp.console_url  # a token file was given: the URL does not carry it
    console.browser.get(console.cp.console_url)
    token = console.one("#token")
    token.send_keys("not-the-token\n")
    # The answer is a new page: wait for its message (the old page's empty one may still be there).
    console.wait(lambda _: "not the console token" in console.css("p.error")[-1].text, "the wrong-token message")
    console.one("#token").send_keys(console.cp.console_token_file.read_text().strip() + "\n")
    console.one('#link-state[data-link="connected"]')
    console.one('#stream-state[data-stream="live"]')
    started = console.one('.ev[data-kind="driver.started"]')
    assert "claude-agent-sdk" in started.text
    fields = console.one("#summary-fields").text
    assert "claude-agent-sdk" in fields and "cattle" in fields
    # The driver's heartbeat activity and its own log lines (log.records) reach the page.
    # Folded under Diagnostics (the conversation comes first): read without opening it.
    activity = 'dd[data-field="activity"]'
    console.wait(lambda _: "provider_pid=" in console.css(activity)[-1].get_attribute("textContent"), "activity")
    assert "driver log line" in console.one('.ev[data-kind="log.records"]').text
    console.shot("01-connected")


def test_a_reply_streams_then_settles(console: Console) -> None:
    run_id = console.send("Hello, console")
    assert "run.completed" in console.terminal(run_id).text
    completed = [e for e in console.cp.events("message.completed") if e["run_id"] == run_id]
    reply = completed[-1]["payload"]
    node = console.css(".message")[-1]
    assert node.get_attribute("data-state") == "settled"
    # Deltas were shown while it streamed (a delta after the completed message is not counted).
    assert int(node.get_attribute("data-deltas")) >= 1
    assert node.find_element("css selector", ".text").text == reply["text"].strip()
    assert console.css(".user-input")[-1].get_attribute("data-status") == "completed"
    console.shot("02-reply-settled")


IN_VIEW = """
const r = arguments[0].getBoundingClientRect();
const hit = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
return r.top >= 0 && r.left >= 0 && r.bottom <= innerHeight && r.right <= innerWidth
    && (hit === arguments[0] || arguments[0].contains(hit));
"""


def in_view(console: Console, element: Any) -> bool:
    """Within the viewport and not covered: what a person sees without scrolling."""
    return bool(console.browser.execute_script(IN_VIEW, element))


def _permission_step(console: Console, text: str, allow: bool, name: str) -> tuple[str, str]:
    previous = console.css(".terminal")  # the run before this one ended with its terminal state
    run_id = console.send(text)
    request = console.one('.permission[data-outcome="pending"]')
    tool_call_id = request.get_attribute("data-tool-call-id")
    assert "s left" in request.find_element("css selector", ".time-left").text
    # The conversation first (issue 35): the prompt's buttons and the last run's end are in view.
    for button in (".allow", ".deny"):
        assert in_view(console, request.find_element("css selector", button)), button
    assert previous and in_view(console, previous[-1]), "the previous run's terminal state"
    console.shot(f"{name}-asked")
    request_id = request.get_attribute("data-request-id")
    request.find_element("css selector", ".allow" if allow else ".deny").click()

    def resolve_commands() -> list[dict[str, Any]]:
        commands = console.cp.api(f"/api/instances/{INSTANCE}/commands")["commands"]
        return [c for c in commands if c["kind"] == "permission.resolve" and c["body"]["request_id"] == request_id]

    # The click reached the CP as this request's permission.resolve (the page's notice says why if not).
    console.wait(lambda _: resolve_commands(), "the click's permission.resolve", timeout=30)
    status = "completed" if allow else "declined"
    console.one(f'.tool[data-tool-call-id="{tool_call_id}"][data-status="{status}"]')
    assert in_view(console, console.terminal(run_id)), "this run's terminal state"
    outcome = request.get_attribute("data-outcome")
    notice = console.one("#notice").text
    assert outcome == ("allowed" if allow else "rejected"), (resolve_commands(), notice)
    console.shot(f"{name}-{status}")
    return run_id, str(tool_call_id)


def test_an_allowed_permission_lets_the_tool_complete(console: Console) -> None:
    _permission_step(console, "[[write:notes.txt:hello from the console]]", True, "03-permission-allow")
    assert (console.cwd / "notes.txt").read_text() == "hello from the console"


def test_a_denied_permission_declines_the_tool(console: Console) -> None:
    # At 1400x900, after runs with activity, timing, log and diagnostic cards; docs/console.png is
    # this step's "asked" screenshot.
    viewport(console.browser, 1400, 900)
    try:
        _, tool_call_id = _permission_step(console, "[[write:denied.txt:never]]", False, "04-permission-deny")
    finally:
        viewport(console.browser, 1280, 800)
    assert not (console.cwd / "denied.txt").exists()
    completed = [e for e in console.cp.events("tool.completed") if e["payload"]["tool_call_id"] == tool_call_id]
    assert completed[-1]["payload"]["status"] == "declined"


def test_a_slow_run_is_cancelled_with_its_phase(console: Console) -> None:
    # 60 s of reply (not [[slow]]'s 20): on a loaded machine the page may learn of the run late, and
    # only a working cancel ends it early.
    run_id = console.send("[[slow:1200]] take your time")
    console.wait(
        lambda _: any(n.text.strip() for n in console.css('.message[data-state="streaming"] .text')),
        "the slow reply streaming",
    )
    # The page knows which run is active (from its stored run.started), so Cancel names it.
    console.wait(lambda b: b.execute_script("return window.agentConsole.activeRun") == run_id, "the active run")
    console.one("#cancel-run").click()
    row = console.terminal(run_id)
    assert "run.cancelled" in row.text
    stored = [e for e in console.cp.events("run.cancelled") if e["run_id"] == run_id][-1]
    phase = stored["payload"]["details"]["phase"]
    assert row.get_attribute("data-phase") == phase and f"phase: {phase}" in row.text
    assert stored["payload"]["requested_by"] == "control_plane"
    console.shot("05-cancelled")


def test_typing_while_the_agent_works_steers_and_queue_is_a_choice(console: Console) -> None:
    """PROTOCOL §3.1 from the console: Enter during a run steers it (the default), or queues behind it."""
    run_id = console.send("[[slow:60]] a long answer")
    console.wait(lambda b: b.execute_script("return window.agentConsole.activeRun") == run_id, "the active run")
    assert console.one('input[name="busy-mode"][value="steer"]').is_selected()
    assert "steers" in console.one("#input-text").get_attribute("placeholder")
    steered_run = console.send("[[say:steered from the console]]")
    assert steered_run == run_id  # the input.steer names the active run
    assert console.cp.api(f"/api/instances/{INSTANCE}/commands")["commands"][-1]["kind"] == "input.steer"
    row = console.one(".steered")
    assert "into the running turn" in row.text and "steered from the console" in row.text
    assert "run.completed" in console.terminal(run_id).text
    final = [e for e in console.cp.events("run.completed") if e["run_id"] == run_id][-1]
    assert final["payload"]["final_message_text"] == "steered from the console"
    console.shot("05b-steered")

    run_id = console.send("[[slow:200]] another long answer")
    console.wait(lambda b: b.execute_script("return window.agentConsole.activeRun") == run_id, "the active run")
    console.one('input[name="busy-mode"][value="queue"]').click()
    assert "queues" in console.one("#input-text").get_attribute("placeholder")
    queued_run = console.send("[[say:queued from the console]]")
    assert queued_run != run_id
    command = console.cp.api(f"/api/instances/{INSTANCE}/commands")["commands"][-1]
    assert command["kind"] == "input.start" and command["body"]["queue"] is True
    console.wait(lambda _: queued_run in console.one('[data-field="queued"]').text, "the queued run in the summary")
    assert console.css(".user-input")[-1].get_attribute("data-input") == "queued"
    assert "run.completed" in console.terminal(queued_run).text  # started once the run before it ended
    console.one('input[name="busy-mode"][value="steer"]').click()
    console.shot("05c-queued")


def test_an_artifact_downloads_with_its_hash(console: Console) -> None:
    run_id = console.send("[[write:outputs/report.txt:the quarterly report]]")
    console.one('.permission[data-outcome="pending"] .allow').click()
    console.terminal(run_id)
    produced = [e for e in console.cp.events("artifact.produced") if e["run_id"] == run_id][-1]
    link = console.one(f'.ev[data-event-id="{produced["event_id"]}"] a')
    assert link.text == "outputs/report.txt"
    link.click()
    target = console.downloads / "report.txt"
    console.wait(lambda _: target.is_file() and target.stat().st_size == produced["payload"]["size"], "the download")
    digest = hashlib.sha256(target.read_bytes()).hexdigest()
    assert digest == produced["payload"]["sha256"] == hashlib.sha256(b"the quarterly report").hexdigest()
    console.shot("06-artifact")


def test_an_attachment_reaches_the_driver(console: Console, tmp_path: Path) -> None:
    brief = tmp_path / "brief.txt"
    brief.write_bytes(b"an attached brief\n")
    console.one("#input-files").send_keys(str(brief))
    run_id = console.send("[[say:attachment read]]")
    assert "run.completed" in console.terminal(run_id).text
    last = console.cp.api(f"/api/instances/{INSTANCE}/commands")["commands"][-1]
    (attachment,) = last["body"]["input"]["attachments"]
    assert attachment["name"] == "brief.txt"
    assert attachment["sha256"] == hashlib.sha256(brief.read_bytes()).hexdigest()
    assert (console.cwd / "inputs" / "brief.txt").read_bytes() == brief.read_bytes()
    assert "attachments: brief.txt" in console.css(".user-input")[-1].text


def test_a_host_tool_call_is_answered_from_the_json_box(console: Console) -> None:
    from selenium.webdriver.common.keys import Keys

    run_id = console.send('[[tool:mcp__host__lookup:{"id": 7}]]')

    def call_or_permission(_: Any) -> Any:
        pending = console.css('.permission[data-outcome="pending"] .allow')
        if pending:
            pending[-1].click()  # a supervised session asks before the MCP tool runs
            return None
        return (console.css('.host-tool[data-outcome="pending"]') or [None])[-1]

    call = console.wait(call_or_permission, "the host tool call")
    assert "lookup" in call.text and '"id": 7' in call.find_element("css selector", ".input").text
    box = call.find_element("css selector", "textarea")
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys('{"content": [{"type": "text", "text": "record 7 is blue"}], "is_error": false}')
    console.shot("07-host-tool")
    call.find_element("css selector", ".send-result").click()
    call_id = call.get_attribute("data-call-id")
    console.one(f'.host-tool[data-call-id="{call_id}"][data-answer="completed"][data-outcome="completed"]')
    assert "run.completed" in console.terminal(run_id).text
    resolved = [e for e in console.cp.events("host_tool.resolved") if e["payload"]["call_id"] == call_id]
    assert [e["payload"]["outcome"] for e in resolved] == ["completed"]
    tool = console.css(".tool")[-1]
    assert tool.get_attribute("data-status") == "completed" and "record 7 is blue" in tool.text
    assert "record 7 is blue" in json.dumps(console.fakes.anthropic.requests)


def test_a_killed_link_shows_disconnected_and_the_timeline_comes_back_complete(console: Console) -> None:
    # The driver frozen: the control plane hears nothing for 3 heartbeats and closes the link (4408).
    console.driver.signal(signal.SIGSTOP)
    try:
        console.one('#link-state[data-link="disconnected"]')
        console.shot("08-link-down")
    finally:
        console.driver.signal(signal.SIGCONT)
    console.one('#link-state[data-link="connected"]')
    # Then the control plane itself dies: the driver's link and the page's stream both drop.
    console.cp.kill()
    console.one('#stream-state[data-stream="reconnecting"]')
    console.shot("09-control-plane-down")
    console.cp.start()
    console.one('#stream-state[data-stream="live"]')
    console.one('#link-state[data-link="connected"]')
    run_id = console.send("[[say:back again]]")
    assert "run.completed" in console.terminal(run_id).text
    stored = {e["event_id"] for e in console.cp.events()}

    def complete(_: Any) -> bool:
        seen = set(console.browser.execute_script("return Array.from(window.agentConsole.seen)"))
        return stored <= seen

    console.wait(complete, "every stored event on the page")
    state = console.browser.execute_script(
        "return {received: window.agentConsole.received, seen: window.agentConsole.seen.size,"
        " links: window.agentConsole.linkHistory}"
    )
    assert state["received"] == state["seen"]  # the resumed stream repeated nothing
    assert state["links"][:3] == ["connected", "disconnected", "connected"]
    console.shot("10-back-complete")


def test_reset_session_from_the_console(console: Console) -> None:
    before = {c["command_id"] for c in console.cp.api(f"/api/instances/{INSTANCE}/commands")["commands"]}
    console.one("#reset-session").click()

    def reset_row(_: Any) -> Any:
        rows = [r for r in console.css(".ev.command") if r.get_attribute("data-command-id") not in before]
        return rows[-1] if rows and rows[-1].get_attribute("data-status") == "completed" else None

    row = console.wait(reset_row, "the session.reset command completed")
    assert "session.reset" in row.text
    command = console.cp.api(f"/api/instances/{INSTANCE}/commands")["commands"][-1]
    assert (command["kind"], command["status"]) == ("session.reset", "completed")
    console.shot("11-reset")


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def test_a_killed_provider_counts_as_a_restart(console: Console) -> None:
    assert console.one('dd[data-field="provider-restarts"]').text == "0"
    (provider,) = [c for c in _children(console.driver.pid) if b"claude" in Path(f"/proc/{c}/cmdline").read_bytes()]
    os.kill(provider, signal.SIGKILL)
    console.wait(lambda _: console.css('dd[data-field="provider-restarts"]')[-1].text == "1", "one provider restart")
    assert any("provider.restarted" in row.text for row in console.css('.ev[data-kind="diagnostic.reported"]'))
    run_id = console.send("[[say:a fresh provider]]")
    assert "run.completed" in console.terminal(run_id).text
    console.shot("12-provider-restarted")


def test_readable_at_phone_width(console: Console) -> None:
    viewport(console.browser, 390, 844)
    try:
        console.one("#input-text")
        overflow = console.browser.execute_script(
            "return document.documentElement.scrollWidth - document.documentElement.clientWidth"
        )
        widest = console.browser.execute_script(
            "return Array.from(document.querySelectorAll('body *')).filter(e => e.getBoundingClientRect().right"
            " > document.documentElement.clientWidth + 1).map(e => e.tagName + '#' + e.id + '.' + e.className)"
        )
        assert overflow <= 0, widest
        console.shot("13-phone")
    finally:
        viewport(console.browser, 1280, 800)
