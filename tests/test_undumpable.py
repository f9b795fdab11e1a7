"""The credential boundary (issue 11): a process of the driver's own uid cannot read the driver's
memory or environment, nor ptrace it, from before the boot payload is read.

Tests run as root here, so the driver and the probe both run as `nobody` (uid 65534). Both get the
same ambient CAP_DAC_READ_SEARCH, only so that uid can reach the interpreter under /root: with equal
capabilities the kernel's ptrace check reduces to the uid and the dumpable flag, which is what is
tested (a probe with fewer capabilities than its target would be refused whatever the flag).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from driver.containment.undumpable import is_dumpable

from .test_boot import TOKEN, payload

ROOT = Path(__file__).resolve().parents[1]
PROBE = ROOT / "tests" / "helpers" / "memory_probe.py"
UID = 65534

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv to switch to a test uid"
)


def as_test_user(argv: list[str]) -> list[str]:
    return [
        "setpriv",
        f"--reuid={UID}",
        f"--regid={UID}",
        "--clear-groups",
        "--inh-caps=+dac_read_search",
        "--ambient-caps=+dac_read_search",
        *argv,
    ]


def test_driver_memory_is_closed_to_its_own_uid(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    os.chown(home, UID, UID)
    p = payload(home)
    (home / "cwd").mkdir()
    os.chown(home / "cwd", UID, UID)
    boot = home / "boot.json"
    boot.write_text(json.dumps(p))
    boot.chmod(0o600)
    os.chown(boot, UID, UID)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_DRIVER")}
    driver = subprocess.Popen(
        as_test_user([sys.executable, "-m", "driver.cli", "run", "--boot-file", str(boot)]),
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        # The driver dials a closed port and retries: it stays up with the token in memory. It has
        # read the payload once the file is gone and its journal exists.
        journal_ready = home / "state"
        deadline_ok = _wait(lambda: (not boot.exists() and journal_ready.exists()) or driver.poll() is not None)
        assert deadline_ok and driver.poll() is None, driver.stderr.read().decode() if driver.stderr else ""
        probe = subprocess.run(
            as_test_user([sys.executable, str(PROBE), str(driver.pid), TOKEN]),
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
        assert probe.returncode == 0, probe.stderr
        result = json.loads(probe.stdout)
        assert result["uid"] == UID
        assert result["environ"].startswith("denied"), result
        assert result["mem"].startswith("denied"), result
        assert result["ptrace"].startswith("denied"), result
        assert driver.poll() is None  # the probe did not stop it
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(timeout=30)


def _wait(condition: object, timeout: float = 60.0) -> bool:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(0.05)  # polling a file system condition: there is no event to wait on
    return False


def test_provider_children_stay_dumpable() -> None:
    """The flag is reset by execve: a child process (a provider) is a normal process."""
    child = "from driver.containment.undumpable import is_dumpable; print(is_dumpable())"
    code = (
        "import subprocess, sys\n"
        "from driver.containment.undumpable import make_undumpable, is_dumpable\n"
        "make_undumpable()\n"
        "assert not is_dumpable()\n"
        f"print(subprocess.run([sys.executable, '-c', {child!r}], capture_output=True, text=True).stdout.strip())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.stdout.strip() == "True", out.stderr
    assert is_dumpable()  # and the test process itself was left alone
