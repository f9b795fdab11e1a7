"""PROTOCOL §8 through the real driver process: one process per state_dir, and providers (with
everything they started) dying with their driver."""

from __future__ import annotations

import os
import signal
from contextlib import ExitStack
from pathlib import Path

import anyio
import pytest

from tests.integration.harness import INSTANCE, DriverProcess, boot_payload, control_plane
from tests.kernel.runtimes import Fakes, payload

pytestmark = pytest.mark.anyio


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _ppid(pid: int) -> int:
    raw = Path(f"/proc/{pid}/stat").read_text()
    return int(raw[raw.rfind(")") + 2 :].split()[1])


def _alive(pid: int) -> bool:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return raw[raw.rfind(")") + 2 :].split()[0] != "Z"


def _descendants(pid: int) -> set[int]:
    """The live process tree below `pid` (outer pids), from /proc."""
    out: set[int] = set()
    todo = [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue
            for k in kids:
                if k not in out:
                    out.add(k)
                    todo.append(k)
    return out


async def test_a_second_driver_on_the_same_state_dir_exits_75_naming_the_holder(
    tmp_path: Path, drivers: list[DriverProcess]
) -> None:
    async with control_plane(tmp_path) as cp:
        first = DriverProcess(tmp_path, boot_payload(tmp_path, cp.url), "first")
        drivers.append(first)
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=30)
        second = DriverProcess(tmp_path, boot_payload(tmp_path, cp.url), "second")
        drivers.append(second)
        assert await second.wait(timeout=30) == 75
        lines = second.stderr().strip().splitlines()
        assert lines == [f"agent-driver: state_dir {tmp_path / 'state'} is in use by pid {first.pid}"]
        # The loser touched nothing: the holder's epoch is still the only one.
        assert cp.hello(INSTANCE)["epoch"] == 1
        assert first.proc.poll() is None


@pytest.mark.provider
@pytest.mark.parametrize("mode", ["auto", "subreaper"])  # auto is the PID namespace here
async def test_driver_sigkill_leaves_no_codex_acp_process_nor_its_setsid_tool(
    mode: str, tmp_path: Path, drivers: list[DriverProcess]
) -> None:
    with ExitStack() as stack:
        fakes = Fakes(stack)
        boot = payload("acp:codex-acp", tmp_path, "", fakes)
        async with control_plane(tmp_path) as cp:
            boot["control"]["url"] = cp.url
            boot["execution"]["permission_policy"] = "full_access"
            d = DriverProcess(tmp_path, boot, extra_env={"AGENT_DRIVER_CONTAINMENT": mode})
            drivers.append(d)
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=60)
            # A long command with one part that leaves every group and session (setsid); it says
            # "up" through a FIFO once both parts exist (an event, not a poll).
            fifo = tmp_path / "cwd" / "up.fifo"  # in cwd: the boot folder (tmp_path) is hidden from tools
            os.mkfifo(fifo)
            reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
            command = f"sh -c 'setsid sleep 307.5 & echo up > {fifo}; exec sleep 308.5'"
            await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": f"[[shell:{command}]]"})
            try:
                with anyio.fail_after(60):
                    await anyio.wait_readable(reader)
                assert os.read(reader, 16) == b"up\n"
            finally:
                os.close(reader)
            tree = _descendants(d.pid)
            assert any(b"codex-acp" in _cmdline(p) for p in tree)
            # The setsid child (forked before "up") left the session of the provider (the driver's child).
            providers = {p for p in tree if _ppid(p) == d.pid}
            assert any(os.getsid(p) == p for p in tree - providers)
            watch = {p: os.pidfd_open(p) for p in tree if _alive(p)}
            os.kill(d.pid, signal.SIGKILL)  # the driver alone, not its group: nothing else is signalled
            d.proc.wait()
            try:
                with anyio.move_on_after(5):
                    for fd in watch.values():
                        await anyio.wait_readable(fd)  # a pidfd is readable once its process exited
            finally:
                for fd in watch.values():
                    os.close(fd)
            left = {p for p in watch if _alive(p)}
            assert not left, {p: _cmdline(p) for p in left}


@pytest.mark.provider
async def test_a_new_driver_kills_what_its_predecessor_left_behind(
    tmp_path: Path, drivers: list[DriverProcess]
) -> None:
    # Without containment (as where namespaces are forbidden), codex-acp outlives a SIGKILLed driver:
    # it ignores stdin EOF. The next driver on the same state_dir must kill it before its own start.
    no_containment = {"AGENT_DRIVER_CONTAINMENT": "none"}
    with ExitStack() as stack:
        fakes = Fakes(stack)
        boot = payload("acp:codex-acp", tmp_path, "", fakes)
        async with control_plane(tmp_path) as cp:
            boot["control"]["url"] = cp.url
            first = DriverProcess(tmp_path, boot, "first", extra_env=no_containment)
            drivers.append(first)
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=60)
            [provider] = [p for p in _descendants(first.pid) if b"codex-acp" in _cmdline(p)]
            watch = os.pidfd_open(provider)
            try:
                os.kill(first.pid, signal.SIGKILL)
                first.proc.wait()
                assert _alive(provider)  # left behind
                second = DriverProcess(tmp_path, boot, "second", extra_env=no_containment)
                drivers.append(second)
                with anyio.fail_after(30):
                    await anyio.wait_readable(watch)  # the predecessor's provider exited
                started = await cp.wait_for_event(
                    INSTANCE, lambda e: e["kind"] == "driver.started" and e["epoch"] == 2, timeout=60
                )
                assert started["payload"]["timings"]["provider_start_ms"] is not None
                log = second.stderr()
            finally:
                os.close(watch)
                # Without containment nothing else kills the providers: leave nothing running.
                leftovers = {provider} | {p for d in drivers for p in _descendants(d.pid)}
                for d in drivers:
                    d.close()
                for pid in leftovers:
                    if _alive(pid):
                        os.kill(pid, signal.SIGKILL)
            assert "containment.predecessor_killed" in log
            assert str(provider) in log
