"""What the console's browser tests drive: a real headless Chromium (Debian's, installed by `make setup`)
and the reference control plane as its own process (`agent-driver controlplane`), as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any

from tests.integration.harness import ROOT

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
START_TIMEOUT_S = 60.0


def chromium(profile: Path, downloads: Path, width: int = 1280, height: int = 800) -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    # As root Chromium needs --no-sandbox; the rest keeps it off the network and quiet.
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
        f"--window-size={width},{height}",
    ):
        options.add_argument(flag)
    options.add_experimental_option(
        "prefs", {"download.default_directory": str(downloads), "download.prompt_for_download": False}
    )
    browser = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    browser.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)})
    viewport(browser, width, height)
    return browser


def viewport(browser: Any, width: int, height: int) -> None:
    """Exactly this page size (a headless window's size includes its invisible frame)."""
    metrics = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": width < 600}
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)


class ControlPlaneProcess:
    """`agent-driver controlplane` in a process of its own; `start()` again restarts it on the same ports."""

    def __init__(self, tmp: Path, token: str, instance: str, cwd: Path, console_token_file: bool = True) -> None:
        self.tmp = tmp
        self.with_console_token_file = console_token_file  # without: a one-time login link is printed
        self.token_file = tmp / "cp.token"
        self.token_file.write_text(token + "\n")
        self.token_file.chmod(0o600)
        self.console_token_file = tmp / "console.token"
        self.token = token
        self.instance = instance
        self.cwd = cwd
        self.port = 0
        self.http_port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.lines: list[str] = []
        self._changed = threading.Condition()

    def start(self) -> None:
        self.lines = []
        argv = [
            sys.executable, "-m", "driver.cli", "controlplane",
            "--db", str(self.tmp / "cp.sqlite3"),
            "--token-file", str(self.token_file),
            *(["--console-token-file", str(self.console_token_file)] if self.with_console_token_file else []),
            "--port", str(self.port),
            "--http-port", str(self.http_port),
            "--heartbeat-ms", "500",
            "--artifacts", f"{self.instance}={self.cwd}",
        ]  # fmt: skip
        log = (self.tmp / "controlplane.log").open("ab")
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.PIPE, cwd=ROOT, start_new_session=True)
        threading.Thread(target=self._read, args=(self.proc, log), daemon=True).start()
        console = self.wait_line("console: ")
        control = self.wait_line("control plane: ")
        self.url = control.split()[2]
        self.http_url = control.split("api: ")[1].strip()
        self.console_url = console.split()[1]
        self.port = int(self.url.rsplit(":", 1)[1].split("/")[0])
        self.http_port = int(self.http_url.rsplit(":", 1)[1])

    def _read(self, proc: subprocess.Popen[bytes], log: Any) -> None:
        assert proc.stderr is not None
        for raw in proc.stderr:
            log.write(raw)
            log.flush()
            with self._changed:
                self.lines.append(raw.decode(errors="replace"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def wait_line(self, prefix: str) -> str:
        def found() -> str | None:
            return next((line for line in self.lines if line.startswith(prefix)), None)

        with self._changed:
            assert self._changed.wait_for(
                lambda: found() is not None or (self.proc is not None and self.proc.poll() is not None),
                timeout=START_TIMEOUT_S,
            ), f"no {prefix!r} line from the control plane"
        line = found()
        assert line is not None, f"the control plane exited: {''.join(self.lines)}"
        return line

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def api(self, path: str) -> Any:
        req = urllib.request.Request(self.http_url + path, headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        suffix = f"&kind={kind}" if kind else ""
        return list(self.api(f"/api/instances/{self.instance}/events?limit=100000{suffix}")["events"])
