"""ProviderProcess: spawning, redacted stderr ring buffer, process-group termination, reaping."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

import anyio
import pytest

from driver import logs
from driver.adapters.common.base import ProviderError
from driver.adapters.common.process import ProviderProcess, secret_values

ENV = {"PATH": "/usr/bin:/bin"}


async def _spawn(code: str, **kw: object) -> ProviderProcess:
    env = dict(ENV)
    env.update(kw.pop("env", {}))  # type: ignore[call-overload]
    return await ProviderProcess.spawn(
        [sys.executable, "-c", code],
        env=env,
        cwd=Path.cwd(),
        name="test",
        **kw,  # type: ignore[arg-type]
    )


def _ns_pid(pid: int) -> str:
    """The process's pid in its innermost PID namespace (the last field of NSpid)."""
    try:
        for status_line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if status_line.startswith("NSpid:"):
                return status_line.split()[-1]
    except OSError:
        pass
    return ""


def in_group(pgid: int) -> list[int]:
    """Every process in process group `pgid`, from /proc (outer-namespace pids)."""
    out: list[int] = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.getpgid(int(entry.name)) == pgid:
                    out.append(int(entry.name))
    return out


async def test_missing_binary_is_provider_missing(tmp_path: Path) -> None:
    with pytest.raises(ProviderError) as info:
        await ProviderProcess.spawn([str(tmp_path / "nope")], env=ENV, cwd=tmp_path, name="ghost")
    assert info.value.code == "provider.missing"
    assert "nope" in info.value.message


async def test_own_process_group_and_exit_code() -> None:
    proc = await _spawn("import sys; sys.exit(7)")
    try:
        assert proc.pgid == proc.pid
        assert proc.pgid != os.getpgid(0)
        with anyio.fail_after(10):
            assert await proc.wait() == 7
        assert proc.exited.is_set()
        assert proc.returncode == 7
        proc.signal_group(signal.SIGTERM)  # already gone: no error
    finally:
        await proc.terminate()


async def test_stdin_stdout_pipes() -> None:
    proc = await _spawn("import sys; sys.stdout.write(sys.stdin.read().upper())")
    try:
        await proc.stdin.send(b"hello")
        await proc.stdin.aclose()
        with anyio.fail_after(10):
            out = b"".join([chunk async for chunk in proc.stdout])
            assert await proc.wait() == 0
        assert out == b"HELLO"
    finally:
        await proc.terminate()


async def test_stderr_is_redacted_and_bounded() -> None:
    secret = "sk-test-1234567890"
    code = (
        "import os, sys\n"
        "for i in range(500): print(f'line {i}', file=sys.stderr)\n"
        "print('key is ' + os.environ['OPENAI_API_KEY'], file=sys.stderr)\n"
        "print('unterminated tail', end='', file=sys.stderr)\n"
    )
    proc = await _spawn(code, env={"OPENAI_API_KEY": secret, "LANG": "C.UTF-8"}, stderr_lines=20)
    try:
        with anyio.fail_after(10):
            assert await proc.wait() == 0
        tail = proc.stderr_tail()
        lines = tail.splitlines()
        assert len(lines) == 20
        assert lines[-2] == "key is [redacted]"
        assert lines[-1] == "unterminated tail"
        assert lines[0] == "line 482"
        assert secret not in tail
        assert len(proc.stderr_tail(max_chars=30)) <= 30
    finally:
        await proc.terminate()


async def test_terminate_escalates_to_sigkill_and_kills_the_group() -> None:
    # The leader ignores SIGTERM and has a child in its group; both must be gone after terminate().
    code = (
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "child = subprocess.Popen(['sleep', '300'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(300)\n"
    )
    proc = await _spawn(code)
    with anyio.fail_after(10):
        line = await proc.stdout.receive()
    assert line.split()[0].isdigit()
    inner_pid = str(int(line.split()[0]))
    # The pid printed is the one inside the provider's PID namespace; find the child from outside by
    # its NSpid (its cmdline reads empty for a moment while its exec is still under way).
    sleepers = [p for p in in_group(proc.pgid) if _ns_pid(p) == inner_pid]
    assert len(sleepers) == 1
    child_pid = sleepers[0]
    # A pidfd becomes readable when the (non-child) process exits: an event, not a poll.
    child_fd = os.pidfd_open(child_pid)
    started = time.monotonic()
    with anyio.fail_after(10):
        code_ = await proc.terminate(grace=0.5)
    assert code_ == -signal.SIGKILL
    assert time.monotonic() - started < 5
    assert proc.returncode == -signal.SIGKILL
    try:
        with anyio.fail_after(5):
            await anyio.wait_readable(child_fd)
    finally:
        os.close(child_fd)
    # Idempotent.
    assert await proc.terminate() == -signal.SIGKILL


async def test_terminate_is_graceful_when_sigterm_is_honoured() -> None:
    proc = await _spawn("import time; print('up', flush=True); time.sleep(300)")
    with anyio.fail_after(10):
        await proc.stdout.receive()  # running (not still inside the wrapper, which ignores SIGTERM)
    with anyio.fail_after(10):
        assert await proc.terminate(grace=5.0) == -signal.SIGTERM


async def test_terminate_survives_a_cancelled_caller() -> None:
    # Wait until the provider runs: during the wrapper's first milliseconds SIGTERM is ignored (the
    # provider gets the default disposition back when it starts; SIGKILL after the grace covers that).
    proc = await _spawn("import time; print('up', flush=True); time.sleep(300)")
    with anyio.fail_after(10):
        await proc.stdout.receive()
    with anyio.CancelScope() as scope:
        scope.cancel()
        await proc.terminate(grace=5.0)
    assert proc.returncode == -signal.SIGTERM


def test_secret_detection() -> None:
    env = {"OPENAI_API_KEY": "abcdefgh", "MY_TOKEN": "tok123456", "PATH": "/usr/bin", "X_KEY": "1"}
    secrets = secret_values(env)
    assert set(secrets) == {"abcdefgh", "tok123456"}
    logs.add(secrets)
    try:
        assert logs.redact("a abcdefgh b tok123456 /usr/bin 1") == "a [redacted] b [redacted] /usr/bin 1"
    finally:
        logs.REDACTOR.clear()
