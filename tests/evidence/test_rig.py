"""The evidence rig's drivers end with the rig: a test timeout that SIGKILLs the evidence command
must not leave the drivers it started running (each is in a session of its own)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from pathlib import Path

SCRIPT = """
import sys
from pathlib import Path
from agent_lab.evidence.rig import DriverProc, Sandbox, payload
box = Sandbox(Path(sys.argv[1]), "drv-rig").create()
# A control plane that never answers: the driver keeps redialing until something ends it.
boot = payload("acp", box, "ws://127.0.0.1:9/", "t" * 32, None, acp_command=["true"])
d = DriverProc(box, boot)
print(d.pid, flush=True)
sys.stdin.read()  # until killed
"""


def test_a_sigkilled_rig_takes_its_drivers_with_it(tmp_path: Path) -> None:
    rig = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "box")], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert rig.stdout is not None
        driver_pid = int(rig.stdout.readline())
        pidfd = os.pidfd_open(driver_pid)  # readable once the driver has exited (it is not our child)
        try:
            # Alive and redialing (it would say why in its log if the boot were refused).
            assert select.select([pidfd], [], [], 2)[0] == [], (tmp_path / "box" / "driver.stderr.log").read_text()
            rig.send_signal(signal.SIGKILL)
            rig.wait(10)
            assert select.select([pidfd], [], [], 20)[0] == [pidfd], "the driver outlived its rig"
        finally:
            os.close(pidfd)
    finally:
        if rig.poll() is None:
            rig.kill()
            rig.wait()
