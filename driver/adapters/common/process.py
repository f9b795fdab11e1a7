"""Supervision of one provider process: spawn, stderr ring buffer, process-group signals, reaping.

Ownership of the background work. A provider process outlives any single adapter call (it is spawned in
`start()`, used by many `run()`s and ended in `stop()`), and those calls share no enclosing task group.
So `spawn()` starts two small background tasks directly on the running asyncio event loop (the driver's
anyio backend is asyncio): one drains stderr into a bounded, redacted ring buffer, one waits for the
exit and sets `exited`. Neither can raise; `terminate()` reaps the process and then retires both. The
caller owns the `ProviderProcess` object and must call `terminate()` when done with it.

The process gets its own session and so its own process group (`start_new_session=True`), which lets
the kernel SIGTERM/SIGKILL the provider together with every tool process it started. It is started
through `driver.containment.wrapper.wrap` (a PID namespace tied to the driver), so nothing it starts outlives
the driver, and recorded so that the next driver process can clean up after this one.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import shutil
import signal
import threading
from collections.abc import Mapping
from pathlib import Path
from subprocess import PIPE

import anyio
import anyio.abc

from driver import containment, logs
from driver.adapters.common.base import ProviderError
from driver.adapters.common.environment import child_env

log = logs.get(__name__)

# Names of variables whose values are credentials; matched as substrings of the upper-cased name.
_SECRET_MARKERS: tuple[str, ...] = ("KEY", "TOKEN", "SECRET", "PASSWORD")
# Values shorter than this are not treated as secrets: redacting "1" or "on" everywhere hides nothing
# and mangles the log.
_MIN_SECRET_LEN = 6
_MAX_LINE_CHARS = 4096


def secret_values(env: Mapping[str, str]) -> list[str]:
    """Values of `env` that look like credentials (by name), longest first. They join the driver's one
    redactor (driver/logs.py) when the process starts: the provider's environment may hold credentials
    the driver made (the host MCP server's token) beside `execution.environment`'s, all of which are
    already there."""
    values = {
        value
        for name, value in env.items()
        if any(marker in name.upper() for marker in _SECRET_MARKERS) and len(value) >= _MIN_SECRET_LEN
    }
    return sorted(values, key=len, reverse=True)


class ProviderProcess:
    """A running provider binary in its own process group. Create with `await ProviderProcess.spawn()`."""

    pid: int
    pgid: int
    stdin: anyio.abc.ByteSendStream
    stdout: anyio.abc.ByteReceiveStream

    def __init__(self, process: anyio.abc.Process, *, name: str, secrets: list[str], stderr_lines: int):
        assert process.stdin is not None and process.stdout is not None and process.stderr is not None
        self._process = process
        self.name = name
        self.pid = process.pid
        # The child called setsid(), so its pgid is its pid; no getpgid() race with a fast exit.
        self.pgid = process.pid
        self.stdin = process.stdin
        self.stdout = process.stdout
        self._stderr = process.stderr
        logs.add(secrets)
        self._lines: collections.deque[str] = collections.deque(maxlen=stderr_lines)
        self._lines_lock = threading.Lock()
        self._partial = ""
        self.exited = anyio.Event()
        self._stderr_done = anyio.Event()
        self._terminated = False
        loop = asyncio.get_running_loop()
        self._tasks = (
            loop.create_task(self._drain_stderr(), name=f"{name}-stderr"),
            loop.create_task(self._watch_exit(), name=f"{name}-wait"),
        )

    @classmethod
    async def spawn(
        cls,
        argv: list[str],
        *,
        env: Mapping[str, str],
        cwd: str | Path,
        name: str,
        stderr_lines: int = 200,
    ) -> ProviderProcess:
        """Start `argv` with exactly `env` (nothing inherited), stdin/stdout/stderr pipes, own session.

        Raises ProviderError("provider.missing") when the executable does not exist or is not executable.
        """
        if not argv:
            raise ValueError("argv must not be empty")
        # The wrapper would turn a missing binary or cwd into its own exit status: check them first.
        if not Path(cwd).is_dir():
            raise ProviderError("provider.missing", f"{name}: working directory {cwd} not found")
        if shutil.which(argv[0], path=env.get("PATH", os.defpath)) is None:
            missing = not (os.sep in argv[0] and Path(argv[0]).exists())
            what = "not found" if missing else "is not executable"
            raise ProviderError("provider.missing", f"{name}: executable {argv[0]} {what}")
        try:
            process = await anyio.open_process(
                await containment.wrap_async(argv),
                stdin=PIPE,
                stdout=PIPE,
                stderr=PIPE,
                cwd=str(cwd),
                env=child_env(env),  # the last word on what a provider sees (withheld values)
                start_new_session=True,
            )
        except FileNotFoundError as exc:
            # Either the binary or the cwd is missing; say which, without echoing the environment.
            what = f"working directory {cwd}" if not Path(cwd).is_dir() else f"executable {argv[0]}"
            raise ProviderError("provider.missing", f"{name}: {what} not found") from exc
        except PermissionError as exc:
            raise ProviderError("provider.missing", f"{name}: {argv[0]} is not executable") from exc
        self = cls(process, name=name, secrets=secret_values(env), stderr_lines=stderr_lines)
        containment.started(self.pid)
        log.debug("provider.spawned", provider=name, pid=self.pid)
        return self

    @property
    def returncode(self) -> int | None:
        return containment.exit_status(self._process.returncode)

    # -- stderr ----------------------------------------------------------------------------------

    def _add_line(self, line: str) -> None:
        line = logs.redact(line)  # the one rule every log record passes (driver/logs.py)
        if len(line) > _MAX_LINE_CHARS:
            line = line[:_MAX_LINE_CHARS] + "…"
        with self._lines_lock:
            self._lines.append(line)

    async def _drain_stderr(self) -> None:
        decoder = _Utf8Decoder()
        try:
            async for chunk in self._stderr:
                text = self._partial + decoder.decode(chunk)
                *complete, self._partial = text.split("\n")
                for line in complete:
                    self._add_line(line)
                # Bound a line that never ends (a progress bar, a binary blob).
                if len(self._partial) > _MAX_LINE_CHARS:
                    self._add_line(self._partial)
                    self._partial = ""
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            pass
        finally:
            if self._partial:
                self._add_line(self._partial)
                self._partial = ""
            self._stderr_done.set()

    def stderr_tail(self, max_chars: int = 4000) -> str:
        """The last lines of stderr (already redacted), at most `max_chars` characters."""
        with self._lines_lock:
            lines = list(self._lines)
        out: list[str] = []
        total = 0
        for line in reversed(lines):
            total += len(line) + 1
            if total > max_chars:
                break
            out.append(line)
        return "\n".join(reversed(out))

    # -- exit ------------------------------------------------------------------------------------

    async def _watch_exit(self) -> None:
        try:
            await self._process.wait()
        finally:
            self.exited.set()

    async def wait(self) -> int:
        """Wait for the process to exit; then give stderr up to a second to drain so a crash's last
        words are in `stderr_tail()`. Returns the exit status (negative: killed by that signal)."""
        await self.exited.wait()
        with anyio.move_on_after(1.0):
            await self._stderr_done.wait()
        code = containment.exit_status(self._process.returncode)
        assert code is not None
        return code

    def signal_group(self, sig: int) -> None:
        """Send `sig` to the whole process group; silently nothing if the group is gone."""
        with contextlib.suppress(PermissionError):
            containment.kill_group(self.pgid, sig)

    async def terminate(self, grace: float = 3.0) -> int:
        """Close stdin, SIGTERM the group, SIGKILL it after `grace` seconds, reap. Idempotent, and
        shielded from cancellation so a cancelled caller never leaves an orphan behind."""
        with anyio.CancelScope(shield=True):
            if not self._terminated:
                self._terminated = True
                with contextlib.suppress(Exception):
                    await self.stdin.aclose()
                self.signal_group(signal.SIGTERM)
                with anyio.move_on_after(grace):
                    await self.exited.wait()
                # Even if the leader exited on SIGTERM, kill stragglers left in its group.
                self.signal_group(signal.SIGKILL)
            code = await self.wait()
            containment.ended(self.pid)
            for task in self._tasks:
                task.cancel()
            with contextlib.suppress(Exception):
                await self._stderr.aclose()
            with contextlib.suppress(Exception):
                await self.stdout.aclose()
            log.debug("provider.terminated", provider=self.name, pid=self.pid, returncode=code)
        return code


class _Utf8Decoder:
    """Incremental UTF-8 decoding that never raises (a chunk may end inside a character)."""

    def __init__(self) -> None:
        import codecs

        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def decode(self, data: bytes) -> str:
        return self._decoder.decode(data)
