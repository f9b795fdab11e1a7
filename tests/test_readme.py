"""The README's "whole flow on one machine" runs as written: each ```sh block is one terminal, run
verbatim by bash from an empty folder with the package's venv on PATH (as after `. .venv/bin/activate`).

The blocks use fixed ports (8089, 8765, 8766), so when the tests run as root they run in a private
network namespace (`unshare --net`), where those ports are free whatever else runs on the machine.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.image.sandbox import CP_READY, ROOT, LineReader

pytestmark = [pytest.mark.provider, pytest.mark.image, pytest.mark.timeout(400)]

SECTION = "### The whole flow on one machine"
# Brings `lo` up in a new network namespace (SIOCGIFFLAGS/SIOCSIFFLAGS, IFF_UP) without iproute2, then
# holds the namespace until its stdin closes.
LOOPBACK_UP = """
import fcntl, socket, struct, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
flags = struct.unpack("16sH22x", fcntl.ioctl(s, 0x8913, struct.pack("16sH22x", b"lo", 0)))[1]
fcntl.ioctl(s, 0x8914, struct.pack("16sH22x", b"lo", flags | 1))
print("up", flush=True)
sys.stdin.read()
"""
FAKE_READY = re.compile(r"fake Anthropic Messages API on http://127\.0\.0\.1:8089")


def flow_blocks(readme: str) -> list[str]:
    assert SECTION in readme, f"README.md lost its section {SECTION!r}"
    section = readme.split(SECTION, 1)[1].split("\n#", 1)[0]
    return re.findall(r"```sh\n(.*?)```", section, re.DOTALL)


@contextmanager
def network() -> Iterator[list[str]]:
    """A command prefix that enters a private network namespace with loopback up (as root), or
    nothing (then the README's ports must be free on this machine)."""
    if os.geteuid() != 0:
        yield []
        return
    # The holder keeps the namespace alive while the blocks enter it; it waits on its stdin, which
    # this test closes at the end.
    holder = subprocess.Popen(
        ["unshare", "--net", "--", sys.executable, "-c", LOOPBACK_UP],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "up", "unshare --net failed"
        yield ["nsenter", f"--net=/proc/{holder.pid}/ns/net"]
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=10)


def _default_signals() -> None:
    # A terminal starts with the signals' default actions. The test runner may have inherited SIGHUP
    # ignored (nohup, a CI runner), and an ignored signal stays ignored across exec: the README's
    # `fake_anthropic &` then outlived the suite.
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


def terminal(prefix: list[str], block: str, cwd: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*prefix, "bash", "-euo", "pipefail", "-c", block],
        cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,  # its own process group: Ctrl-C (SIGINT) goes to the whole terminal
        preexec_fn=_default_signals,
    )  # fmt: skip


def group_members(pgid: int) -> list[int]:
    """Live processes of process group `pgid` (zombies excluded), read from /proc."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry))
    return members


def wait_gone(pgid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while group_members(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)  # polling /proc: there is no event for "a process of another parent exited"
    return True


def stop(proc: subprocess.Popen[str], sig: signal.Signals = signal.SIGINT) -> list[int]:
    """`sig` to the terminal's foreground work, then SIGHUP to what is left of its process group, as
    closing the terminal would (bash's `&` jobs ignore SIGINT); SIGKILL for anything still there.
    Returns what had to be killed (a test asserts it is nothing)."""
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGHUP)
    if wait_gone(proc.pid, 10):
        return []
    left = group_members(proc.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    wait_gone(proc.pid, 10)
    return left


def test_the_readme_flow_runs_as_written(tmp_path: Path) -> None:
    blocks = flow_blocks((ROOT / "README.md").read_text())
    assert len(blocks) == 3, "the flow is three terminals: the control plane, the driver, the client"
    home = tmp_path / "home"
    home.mkdir()
    folder = tmp_path / "flow"
    folder.mkdir()
    env = {"PATH": f"{ROOT / '.venv' / 'bin'}:/usr/bin:/bin", "VIRTUAL_ENV": str(ROOT / ".venv"),
           "HOME": str(home), "LANG": "C.UTF-8"}  # fmt: skip
    if os.environ.get("PYTHONPATH"):  # a shared venv with the tree under test first on the path
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    with network() as prefix:
        first = terminal(prefix, blocks[0], folder, env)
        second: subprocess.Popen[str] | None = None
        try:
            assert first.stdout is not None
            out1 = LineReader(first.stdout)
            out1.wait_for(FAKE_READY, timeout=60)
            out1.wait_for(CP_READY, timeout=60)
            second = terminal(prefix, blocks[1], folder, env)
            assert second.stdout is not None
            out2 = LineReader(second.stdout)
            third = subprocess.run(
                [*prefix, "bash", "-euo", "pipefail", "-c", blocks[2]],
                cwd=folder, env=env, capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            driver_log = "".join(out2.lines)
            assert third.returncode == 0, f"{third.stdout}\n{third.stderr}\n--- terminal 2:\n{driver_log[-4000:]}"
            assert '"kind": "run.completed"' in third.stdout
            assert '"text": "Hello from the README"' in third.stdout
            # session.stop was the last command: the driver leaves cleanly, and terminal 2 with it.
            assert second.wait(timeout=60) == 0, "".join(out2.lines)[-4000:]
            assert "wrote a claude-agent-sdk boot payload for drv-readme" in "".join(out2.lines)
            assert not (folder / "boot" / "boot.json").exists()
            token = (folder / "cp.token").read_text().strip()
            assert token not in "".join(out2.lines) + third.stdout + third.stderr
        finally:
            left = stop(second, signal.SIGTERM) if second is not None else []
            left += stop(first)
        assert first.returncode == 0, "terminal 1 (the control plane) stops cleanly on Ctrl-C"
        assert not left, f"processes outlived their terminal (SIGKILLed): {left}"
