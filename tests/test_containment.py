"""driver.containment with real processes: the wrapper, and the clean-up after a predecessor."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from driver import containment
from driver.containment import record as process_record

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _alive(pid: int) -> bool:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return raw[raw.rfind(")") + 2 :].split()[0] != "Z"


async def _gone(pid: int, timeout: float = 5.0) -> None:
    """Wait for a (not necessarily child) process to exit: a pidfd becomes readable then."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        with anyio.fail_after(timeout):
            await anyio.wait_readable(fd)
    finally:
        os.close(fd)


def test_default_mode_is_a_pid_namespace_here() -> None:
    # bwrap is installed by `make setup`; on this machine namespaces are allowed.
    assert containment.mode_of(containment.prefix()) == "pidns"
    assert containment.exit_status(128 + 9) == -9 and containment.exit_status(3) == 3


async def test_predecessor_processes_are_killed_only_when_their_start_time_matches(tmp_path: Path) -> None:
    # A recorded group leader with a child still in its group.
    ours = await anyio.open_process(["sh", "-c", "sleep 301 & echo $!; exec sleep 300"], start_new_session=True)
    assert ours.stdout is not None
    with anyio.fail_after(10):
        stayed = int((await ours.stdout.receive()).split()[0])
    stranger = await anyio.open_process(["sleep", "302"], start_new_session=True)
    try:
        record = containment.ProcessRecord(tmp_path)
        record.add(ours.pid)
        entries = record.read()
        assert entries == [{"pid": ours.pid, "pgid": ours.pid, "start": containment.start_time(ours.pid)}]
        # The stranger's pid with a wrong start time: a reused pid, which must not be signalled.
        start = containment.start_time(stranger.pid)
        assert start is not None
        record._entries[stranger.pid] = {"pid": stranger.pid, "pgid": stranger.pid, "start": start + 1}
        record._write()
        killed = containment.track(tmp_path)
        assert sorted(killed) == sorted([ours.pid, stayed])
        with anyio.fail_after(5):
            assert await ours.wait() == -signal.SIGKILL
        await _gone(stayed)
        assert stranger.returncode is None and _alive(stranger.pid)
        assert json.loads(record.path.read_text())["entries"] == []  # the new process starts its own record
    finally:
        for p in (ours, stranger):
            if p.returncode is None:
                p.kill()
                await p.wait()
        process_record._record = None


@pytest.mark.parametrize("mode", ["pidns", "subreaper"])
async def test_a_wrapped_tree_dies_with_its_parent_even_a_setsid_child(mode: str, tmp_path: Path) -> None:
    # A parent process spawns a wrapped child that starts a `setsid` grandchild; the parent is then
    # SIGKILLed. The grandchild left every group and session we know of, and must die anyway.
    script = (
        "import subprocess, sys, time\n"
        "from driver import containment\n"
        "argv = containment.wrap(['sh', '-c', 'setsid sleep 303 & echo up; exec sleep 304'])\n"
        "subprocess.Popen(argv, start_new_session=True)\n"
        "time.sleep(300)\n"
    )
    parent = await anyio.open_process(
        [sys.executable, "-c", script],
        cwd=Path(__file__).resolve().parents[1],
        stderr=subprocess.DEVNULL,
        env={**os.environ, containment.ENV_MODE: mode},
    )
    assert parent.stdout is not None
    try:
        with anyio.fail_after(10):
            # Printed after the setsid child was forked: from then on the whole tree exists.
            seen = b""
            while b"up\n" not in seen:  # after the wrapper's own log line
                seen += await parent.stdout.receive()
        tree = _descendants(parent.pid)
        # pidns: bwrap, pid 1, the shell (now sleep 304), the setsid child; subreaper: one fewer.
        assert len(tree) >= (4 if mode == "pidns" else 3)
        assert any(os.getsid(p) == p for p in tree)  # the setsid child left every session we own
        parent.kill()
        await parent.wait()
        for pid in tree:
            await _gone(pid)
    finally:
        if parent.returncode is None:
            parent.kill()
            await parent.wait()


def _descendants(pid: int) -> set[int]:
    out: set[int] = set()
    todo = [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*"):
            try:
                kids = {int(k) for k in (task / "children").read_text().split()}
            except OSError:
                continue
            todo.extend(kids - out)
            out |= kids
    return out


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
