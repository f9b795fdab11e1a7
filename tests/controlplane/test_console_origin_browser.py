"""PROTOCOL §9 in a real headless Chromium: the console is an operator's tool.

A page served on ANOTHER loopback port (what an agent can serve and get the operator to open) tries,
with the operator logged in to the console in the same browser, to queue a command and upload a file:
CORS JSON, no-cors text/plain and form-encoded fetches, and a real form post. Ports are the same site
to a browser, so the session cookie goes along; the console refuses each (its own Origin, a JSON body)
and stores nothing. The same request from the console's own page succeeds (the control). The session
cookie is random, HttpOnly and named for the console's port; the printed login link works once.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.controlplane.browser import ControlPlaneProcess, chromium

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

TOKEN = "cp-token-origin-test-0123456789"
INSTANCE = "drv-origin.1"
WAIT_S = 30.0

EVIL = """<!doctype html><html><body><pre id="out"></pre>
<form id="f" method="post" action="%(console)s/api/instances/%(instance)s/commands" enctype="text/plain">
<input type="hidden" name='{"kind": "session.reset", "x": "' value='"}'></form>
<script>
const C = "%(console)s", I = "%(instance)s", results = {};
const body = JSON.stringify({kind: "session.reset", reason: "from another port"});
async function attempt(name, path, init) {
  try {
    const r = await fetch(C + path, Object.assign({credentials: "include"}, init));
    results[name] = r.type === "opaque" ? "opaque" : String(r.status);
  } catch (e) { results[name] = "blocked"; }
}
(async () => {
  const commands = `/api/instances/${I}/commands`;
  await attempt("cors json", commands, {method: "POST", headers: {"Content-Type": "application/json"}, body});
  await attempt("no-cors text", commands, {method: "POST", mode: "no-cors",
    headers: {"Content-Type": "text/plain"}, body});
  await attempt("no-cors form", commands, {method: "POST", mode: "no-cors",
    headers: {"Content-Type": "application/x-www-form-urlencoded"}, body: "kind=session.reset"});
  await attempt("no-cors upload", `/console/instances/${I}/uploads`, {method: "POST", mode: "no-cors",
    headers: {"Content-Type": "text/plain"}, body: JSON.stringify({name: "x.txt", data_b64: "eA=="})});
  await attempt("read", "/console/instances", {});
  document.getElementById("out").textContent = JSON.stringify(results);
})();
</script></body></html>"""


def serve_page(html: str) -> tuple[ThreadingHTTPServer, str]:
    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data = html.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[ControlPlaneProcess]:
    (tmp_path / "cwd").mkdir()
    cp = ControlPlaneProcess(tmp_path, TOKEN, INSTANCE, tmp_path / "cwd", console_token_file=False)
    cp.start()
    try:
        yield cp
    finally:
        cp.kill()


def wait(browser: Any, condition: Any, what: str) -> Any:
    from selenium.webdriver.support.wait import WebDriverWait

    return WebDriverWait(browser, WAIT_S, ignored_exceptions=(Exception,)).until(condition, what)


def test_a_page_on_another_loopback_port_cannot_act_with_the_operator_session(
    plane: ControlPlaneProcess, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    link = plane.console_url
    assert "/?login=" in link and plane.http_url in link
    server, evil_url = serve_page(EVIL % {"console": plane.http_url, "instance": INSTANCE})
    assert evil_url.split(":")[2] != plane.http_url.split(":")[2]  # another port, same loopback host
    browser = chromium(tmp_path / "profile", tmp_path / "downloads")
    try:
        browser.get(link)
        wait(browser, lambda b: b.find_elements(By.CSS_SELECTOR, "#link-state"), "the console page")
        # The session cookie: random (not the token), HttpOnly, named for this console's port.
        cookies = {c["name"]: c for c in browser.get_cookies()}
        name = f"agent_driver_console_{plane.http_port}"
        assert set(cookies) == {name}, cookies
        assert cookies[name]["httpOnly"] is True and cookies[name]["sameSite"] == "Strict"
        assert cookies[name]["value"] != TOKEN and len(cookies[name]["value"]) >= 40
        assert browser.execute_script("return document.cookie") == ""

        browser.get(evil_url)
        out = wait(browser, lambda b: b.find_element(By.ID, "out").text, "the attack's results")
        results = json.loads(out)
        assert results["cors json"] == "blocked" and results["read"] == "blocked", results
        # The opaque ones reached the server, with the cookie: the server refused them (below).
        assert plane.api(f"/api/instances/{INSTANCE}/commands")["commands"] == []
        # A real form post: a top-level navigation, which the console answers with its refusal.
        browser.execute_script("document.getElementById('f').submit()")
        wait(browser, lambda b: "cross-origin request refused" in b.page_source, "the console's refusal")
        assert plane.api(f"/api/instances/{INSTANCE}/commands")["commands"] == []
        uploads = tmp_path / "cp.sqlite3.uploads"
        assert not uploads.exists() or list(uploads.iterdir()) == []

        # The control: the console's own page, same session, same request, succeeds.
        browser.get(plane.http_url + "/")
        wait(browser, lambda b: b.find_elements(By.CSS_SELECTOR, "#link-state"), "the console page again")
        status = browser.execute_async_script(
            """const done = arguments[arguments.length - 1];
            fetch(arguments[0], {method: "POST", credentials: "same-origin",
              headers: {"Content-Type": "application/json"},
              body: JSON.stringify({kind: "session.reset", reason: "from the console"})})
              .then(r => done(r.status), e => done(String(e)));""",
            f"/api/instances/{INSTANCE}/commands",
        )
        assert status == 201
        commands = plane.api(f"/api/instances/{INSTANCE}/commands")["commands"]
        assert [c["body"].get("reason") for c in commands] == ["from the console"]

        # The printed link worked once: a second visit (no session) logs nobody in.
        browser.delete_all_cookies()
        browser.get(link)
        wait(browser, lambda b: "used already" in b.page_source, "the used-link message")
        assert browser.get_cookies() == []
    finally:
        browser.quit()
        server.shutdown()
