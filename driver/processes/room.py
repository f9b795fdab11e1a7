"""The kernel's process room (PROTOCOL §6.8): the processes beside the agent, their commands, their
output and their ends.

Each process has one task (`_life`): it pumps the output (`driver.processes.output`: into the ring
first, then as best-effort `process.output` events, paced), waits for the exit, and then admits the
lossless `process.exited`, once. Processes belong to the session: a run's cancel never reaches
them; `session.stop` ends them (TERM, then KILL after 3 s); the driver's death ends them through the
containment they were started in.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from driver import containment, logs, tasks
from driver.adapters.common.environment import provider_env
from driver.agent_files import AgentFileError
from driver.interfaces import PathNotAllowed
from driver.kernel import provider_home
from driver.processes import handle
from driver.processes import spawn as spawning
from driver.processes.output import Output, must_wait
from driver.processes.proc import Proc
from driver.processes.ring import plan_replay
from driver.processes.ringfile import RingFile, RingTampered, folder, leftovers, reset_folder
from driver.processes.spec import MAX_PROCESSES, SIGNALS, SpecError, argv_of, env_of, exit_info
from driver.processes.text import TAIL_BYTES, tail_of
from driver.protocol import commands as cmds
from driver.protocol.frames import CommandError, HeartbeatProcess

if TYPE_CHECKING:
    from driver.kernel.core import Kernel

log = logs.get("driver.processes")

STOP_GRACE_S = 3.0  # session.stop: TERM, then KILL after this long
KILL_WAIT_S = 5.0  # after KILL, how long stop waits for the exits to be reported
OUTPUT_DRAIN_S = 2.0  # after the exit, how long the output may still be read (a child may hold it open)
INPUT_TIMEOUT_S = 10.0  # a process.input that the process does not read within this fails
KEPT_EXITED = 48  # exited processes whose rings are kept for replay (the oldest go first)


class CommandFailed(Exception):
    def __init__(self, code: str, message: str, retryable: bool = False) -> None:
        super().__init__(message)
        self.error = CommandError(code, message, retryable)


class ProcessRoom:
    def __init__(self, kernel: Kernel) -> None:
        self.k = kernel
        state_dir = Path(kernel.boot.session.state_dir)
        # What a dead predecessor left running died with it: each still gets its process.exited.
        # The rings are authenticated under the journal's key (PROTOCOL §9: where they are not hidden).
        self._mac = kernel.journal.mac
        self._leftovers = leftovers(folder(state_dir), self._mac)
        self.root = reset_folder(state_dir)
        self.procs: dict[str, Proc] = {}
        self._exited: deque[str] = deque()
        self._starting: set[str] = set()
        self._no_start = anyio.Event()  # set while no process.start is between its checks and its spawn
        self._no_start.set()
        self._stopping = False
        self._generation = 0
        self.output = Output(lambda kind, body: kernel.emit(kind, body), lambda: kernel.max_event_bytes, self._waits)

    async def recover(self) -> None:
        """At start, before any command: end the processes a dead driver process left. They died with
        it (the containment's SIGKILL); the ring it left gives their length and tail."""
        for left in self._leftovers:
            await self.k.emit(
                "process.exited",
                {
                    "process_id": left.process_id,
                    "exit_code": None,
                    "signal": "KILL",
                    "output_bytes": left.output_bytes,
                    "tail": tail_of(left.tail, cut=left.cut),
                },
            )
            log.warning("process.died_with_driver", process_id=left.process_id)
        self._leftovers = []

    # -- commands ---------------------------------------------------------------------------------
    async def execute(self, command: cmds.ProcessCommand) -> tuple[dict[str, Any] | None, CommandError | None]:
        """Run one process.* command: (result, None) or (None, error)."""
        try:
            match command:
                case cmds.ProcessStart():
                    return await self.start(command), None
                case cmds.ProcessInput():
                    await self.input(self._get(command.process_id), command.data.encode())
                    return {}, None
                case cmds.ProcessResize():
                    self.resize(self._get(command.process_id), command.cols, command.rows)
                    return {}, None
                case cmds.ProcessSignal():
                    return self.signal(self._get(command.process_id), SIGNALS[command.signal]), None
                case cmds.ProcessReplay():
                    return await self.replay(self._get(command.process_id), command.from_offset), None
        except CommandFailed as exc:
            return None, exc.error
        except SpecError as exc:
            return None, CommandError(exc.code, exc.message)
        except OSError as exc:  # the state_dir's disk, a folder: the command fails, the driver goes on
            log.error("process.command_failed", error=type(exc).__name__, exc_info=True)
            return None, CommandError("driver.internal_error", f"{type(exc).__name__}: {exc.strerror or 'I/O error'}")
        return None, CommandError("command.invalid", "not a process command")

    def _get(self, process_id: str) -> Proc:
        p = self.procs.get(process_id)
        if p is None:
            raise CommandFailed("process.not_found", f"no process {process_id!r} in this driver process")
        return p

    async def start(self, c: cmds.ProcessStart) -> dict[str, Any]:
        if self._stopping:  # session.stop has begun: a process started now would outlive its TERM
            raise CommandFailed("driver.stopping", "the driver is stopping", retryable=True)
        old = self.procs.get(c.process_id)
        if c.process_id in self._starting or (old is not None and not old.exited.is_set()):
            raise CommandFailed("process.exists", f"process {c.process_id!r} is running")  # until its exit is out
        live = sum(1 for p in self.procs.values() if not p.exited.is_set()) + len(self._starting)
        if live >= MAX_PROCESSES:
            raise CommandFailed("process.limit", f"at most {MAX_PROCESSES} processes run at once", retryable=True)
        # Reserved before the first wait: two starts of one id, or a 17th, cannot both pass the checks.
        self._starting.add(c.process_id)
        self._no_start = anyio.Event()
        try:
            return await self._start(c, old)
        finally:
            self._starting.discard(c.process_id)
            if not self._starting:
                self._no_start.set()

    async def _start(self, c: cmds.ProcessStart, old: Proc | None) -> dict[str, Any]:
        k = self.k
        cwd = self._cwd(c.cwd)
        pty = (c.pty.cols, c.pty.rows) if c.pty is not None else None
        proxy = k.boot.execution.model_proxy
        env = env_of(await self._provider_env(), c.env, proxy.secrets if proxy else [], pty=pty is not None)
        argv = argv_of(c.argv, env, handle.account_shell())
        if handle.executable(argv[0], env.get("PATH"), cwd) is None:
            raise CommandFailed("process.spawn_failed", f"argv[0] is not an executable: {argv[0][:200]!r}")
        prefix = await spawning.prefix()
        try:
            spawned = spawning.spawn(argv, env, cwd, pty, prefix)
        except OSError as exc:
            raise CommandFailed("process.spawn_failed", f"the process could not start: {exc.strerror or exc}") from None
        containment.started(spawned.proc.pid)
        if old is not None:
            self._forget(old)
        self._generation += 1
        try:
            ring = RingFile(self.root, c.process_id, self._generation, pid=spawned.proc.pid, mac=self._mac)
        except OSError as exc:  # the disk: the process must not run unrecorded
            handle.send_signal(spawned, signal.SIGKILL, pty=pty is not None)
            await handle.wait_exit(spawned)
            containment.ended(spawned.proc.pid)
            handle.close_fds(spawned)
            raise CommandFailed("process.spawn_failed", f"its output ring: {exc.strerror or exc}") from None
        p = Proc(c.process_id, argv, pty, spawned, ring)
        self.procs[c.process_id] = p
        await k.emit(
            "process.started",
            {
                "process_id": p.process_id,
                "argv": argv,
                "pty": {"cols": pty[0], "rows": pty[1]} if pty else None,
                "pid": p.pid,
            },
        )
        log.info("process.started", process_id=p.process_id, pid=p.pid, pty=pty is not None)
        k.spawn(self._life, p)
        return {"pid": p.pid}

    def _cwd(self, requested: str | None) -> Path:
        try:
            path = self.k.files.admit(requested if requested is not None else self.k.files.cwd)
        except PathNotAllowed as exc:
            raise CommandFailed("path.not_allowed", f"cwd: {exc}") from None
        if not path.is_dir():
            raise CommandFailed("path.not_allowed", "cwd is not a directory")
        return path

    async def _provider_env(self) -> dict[str, str]:
        boot = self.k.boot
        # The provider's home is the agent's: a file or link it left there is set aside, as at a
        # provider start (a plain mkdir failed every process.start while the provider lived on).
        try:
            home, notes = provider_home.prepare(Path(boot.session.state_dir), boot.execution.runtime)
        except AgentFileError as exc:
            raise CommandFailed("process.spawn_failed", f"the provider's home: {exc}", retryable=True) from None
        for note in notes:
            await self.k.emit("diagnostic.reported", note)
        return provider_env(boot.execution.environment, home=str(home))

    async def input(self, p: Proc, data: bytes) -> None:
        if not p.running:
            raise CommandFailed("process.not_running", f"process {p.process_id!r} has exited")
        fd = p.spawned.write_fd
        view = memoryview(data)
        with anyio.move_on_after(INPUT_TIMEOUT_S) as scope:
            async with p.write_lock:
                while view:
                    if not p.running:  # checked before every write: a closed fd's number may be reused
                        raise CommandFailed("process.not_running", f"process {p.process_id!r} has exited")
                    try:
                        view = view[os.write(fd, view) :]
                    except BlockingIOError:
                        try:
                            await anyio.wait_writable(fd)
                        except anyio.ClosedResourceError:
                            raise CommandFailed("process.not_running", "its input was closed") from None
                    except OSError as exc:  # EPIPE, EIO: its input is gone
                        raise CommandFailed("process.not_running", f"its input is closed ({exc.strerror})") from None
        if scope.cancelled_caught:
            raise CommandFailed("process.busy", "the process did not read its input in time", retryable=True)

    def resize(self, p: Proc, cols: int, rows: int) -> None:
        if p.pty is None:
            raise CommandFailed("process.not_a_terminal", f"process {p.process_id!r} has pipes, not a terminal")
        if not p.running:
            raise CommandFailed("process.not_running", f"process {p.process_id!r} has exited")
        try:
            spawning.set_winsize(p.spawned.write_fd, cols, rows)
        except OSError as exc:
            raise CommandFailed("process.not_running", f"its terminal is gone ({exc.strerror})") from None
        p.pty = (cols, rows)

    def signal(self, p: Proc, sig: int) -> dict[str, Any]:
        if not p.running:
            return {"already_exited": True}
        handle.send_signal(p.spawned, sig, pty=p.pty is not None)
        return {}

    async def replay(self, p: Proc, from_offset: int) -> dict[str, Any]:
        total = p.ring.total
        if from_offset > total:
            raise CommandFailed("process.offset_ahead", f"from_offset {from_offset} is past the output ({total} bytes)")
        plan = plan_replay(from_offset, total, p.ring.capacity)
        try:
            data = p.ring.read(plan.start, plan.end)  # read at once: the ring may turn while this is sent
        except RingTampered as exc:
            # Not the driver's bytes (PROTOCOL §9): nothing of them is sent, and the finding is reported.
            containment.report("process_rings", p.process_id, "mac")
            raise CommandFailed(
                "process.ring_tampered", f"the output ring failed its check ({exc}); nothing sent"
            ) from None
        await self.output.send(p, plan.start, data, truncated_before=plan.truncated_before)
        return {"from_offset": plan.start, "to_offset": plan.end, "truncated_before": plan.truncated_before}

    def _waits(self) -> bool:
        outbox = self.k.outbox
        return must_wait(
            link_up=outbox.link_up,
            best_effort_waiting=len(outbox.best_effort),
            lossless_pending=outbox.pending_count,
            commands=self.k.commands.kinds.values(),
        )

    # -- life and end -----------------------------------------------------------------------------
    async def _life(self, p: Proc) -> None:
        returncode: int | None = None
        try:
            async with tasks.within("process life") as tg:
                tg.spawn(self.output.pump, p)
                returncode = await handle.wait_exit(p.spawned)
                with anyio.move_on_after(OUTPUT_DRAIN_S):
                    await p.output_done.wait()
                tg.cancel_scope.cancel()
        except Exception as exc:  # never let one process take the driver down
            log.error("process.failed", process_id=p.process_id, error=type(exc).__name__, exc_info=True)
        finally:
            with anyio.CancelScope(shield=True):
                await self._ended(p, returncode)

    async def _ended(self, p: Proc, returncode: int | None) -> None:
        if returncode is None:  # the wait failed: make sure it is gone
            handle.send_signal(p.spawned, signal.SIGKILL, pty=p.pty is not None)
            with contextlib.suppress(Exception):
                returncode = await handle.wait_exit(p.spawned)
        code = containment.exit_status(returncode)
        containment.ended(p.pid)
        p.running = False  # before the fds close: no command may use them from here on
        handle.close_fds(p.spawned)
        with contextlib.suppress(Exception):
            if p.pending:
                await self.output.live(p, b"", final=True)
        info = exit_info(code if code is not None else -signal.SIGKILL)
        total = p.ring.total
        start = max(0, total - TAIL_BYTES)
        try:
            tail = tail_of(p.ring.read(start, total), cut=start > 0)
        except RingTampered:
            containment.report("process_rings", p.process_id, "mac")
            tail = ""
        await self.k.emit(
            "process.exited",
            {
                "process_id": p.process_id,
                "exit_code": info.exit_code,
                "signal": info.signal,
                "output_bytes": total,
                "tail": tail,
            },
        )
        p.ring.ended()  # journaled: a successor must not end it again
        log.info("process.exited", process_id=p.process_id, exit_code=info.exit_code, signal=info.signal)
        self._exited.append(p.process_id)
        while len(self._exited) > KEPT_EXITED:
            gone = self.procs.get(self._exited.popleft())
            if gone is not None and gone is not p and gone.exited.is_set():
                self._forget(gone)
        p.exited.set()

    def _forget(self, p: Proc) -> None:
        if self.procs.get(p.process_id) is p:
            del self.procs[p.process_id]
        with contextlib.suppress(ValueError):
            self._exited.remove(p.process_id)
        p.ring.close(remove=True)

    async def stop_all(self) -> None:
        """session.stop: TERM, KILL after 3 s, and wait until every `process.exited` is admitted.

        A start accepted before the stop may still be spawning: it is waited for (bounded), so its
        process is ended here too and its exit reported, instead of outliving the driver unreported."""
        self._stopping = True
        with anyio.move_on_after(STOP_GRACE_S):
            await self._no_start.wait()
        running = [p for p in self.procs.values() if not p.exited.is_set()]
        if not running:
            return
        for p in running:
            if p.running:
                handle.send_signal(p.spawned, signal.SIGTERM, pty=p.pty is not None)
        with anyio.move_on_after(STOP_GRACE_S):
            for p in running:
                await p.exited.wait()
        for p in running:
            if p.running:
                handle.send_signal(p.spawned, signal.SIGKILL, pty=p.pty is not None)
        with anyio.move_on_after(KILL_WAIT_S):
            for p in running:
                await p.exited.wait()

    def kill_now(self) -> None:
        for p in self.procs.values():
            if p.running:
                handle.send_signal(p.spawned, signal.SIGKILL, pty=p.pty is not None)

    def heartbeat(self) -> list[HeartbeatProcess]:
        now = time.monotonic()
        return [
            HeartbeatProcess(process_id=p.process_id, pid=p.pid, running_ms=int((now - p.started) * 1000))
            for p in self.procs.values()
            if p.running
        ]
