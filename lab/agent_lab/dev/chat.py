"""The chat: one loop over actions (typed lines, signals, and what the control plane reports)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TextIO

from agent_lab.dev import typed
from agent_lab.dev.asking import Asking
from agent_lab.dev.common import (
    CONSOLE_PREFIX,
    HELP,
    READY_TIMEOUT_S,
    SHELL_COLS,
    SHELL_ROWS,
    STOP_TIMEOUT_S,
    USER_PROMPT,
    Action,
    DevPaths,
    new_command_id,
)
from agent_lab.dev.follow import Followed, Following, new_run
from agent_lab.dev.launch import end_process, log_tail
from agent_lab.dev.pump import Pump
from agent_lab.dev.view import Status, Transcript, short

if TYPE_CHECKING:
    from agent_lab.controlplane.live import Subscription
    from agent_lab.controlplane.server import ControlPlane


class DevChat:
    """Sends commands through the control plane and shows the events it stores.

    Every state change happens in `serve`'s loop, one action at a time: typed lines, Ctrl-C, the
    driver's exit, and the pump's notices (ready, run ended, permission asked). A line typed while a
    run is active steers it (`input.steer`); `/queue TEXT` queues a run behind it in the driver
    (`input.start{"queue": true}`, PROTOCOL §3.1), which the chat follows once the run before it ends.
    Lines typed before the driver is ready, and `/quit`, wait their turn, so a script can type ahead.
    """

    def __init__(
        self,
        cp: ControlPlane,
        paths: DevPaths,
        driver: asyncio.subprocess.Process,
        out: TextIO,
        actions: asyncio.Queue[Action],
        *,
        once: str | None,
        prompts: bool,
        color: bool,
    ) -> None:
        self.cp = cp
        self.instance_id = paths.instance_id
        self.driver = driver
        self.paths = paths
        self.out = out
        self.once = once
        self.prompts = prompts  # stdin is a terminal: show "you> " and "allow? [y/n] "
        self.actions = actions
        self.transcript = Transcript(color)
        self.status = Status()
        self.phase = "starting"  # starting | idle | running | stopping
        self.follow = Following()  # the run shown now, and those queued in the driver behind it
        self.waiting: deque[Action] = deque()  # typed ahead: ("input", text) | ("quit", None)
        self.asking = Asking()  # permission requests waiting for the user's y/n
        self.stdin_open = once is None
        self.commands: dict[str, str] = {}  # command id -> kind, for commands this chat sent
        self.pump = Pump(
            follow=self.follow,
            status=self.status,
            transcript=self.transcript,
            commands=self.commands,
            write=self.write,
            push=self.push,
            stopping=lambda: self.phase == "stopping",
        )
        self._tasks: list[asyncio.Task[None]] = []

    # -- output ---------------------------------------------------------------------------------
    def write(self, text: str) -> None:
        if text:
            self.out.write(text)
            self.out.flush()

    def say(self, text: str) -> None:
        self.write(self.transcript.line(text))

    def prompt(self) -> None:
        if self.prompts and self.phase == "idle" and not self.waiting and not self.asking:
            self.write(USER_PROMPT)
            self.transcript.mark_line_start(False)

    def push(self, action: Action) -> None:
        self.actions.put_nowait(action)

    # -- commands -------------------------------------------------------------------------------
    async def send(self, kind: str, command_id: str | None = None, **fields: Any) -> None:
        command_id = command_id or new_command_id()
        self.commands[command_id] = kind  # before sending: its update may come back at once
        await self.cp.send_command(self.instance_id, kind, command_id=command_id, **fields)

    async def start_run(self, text: str) -> None:
        run = self.follow.run = new_run()
        self.phase = "running"
        await self.send("input.start", run.command_id, run_id=run.run_id, input={"text": text})

    async def steer(self, text: str) -> None:
        """PROTOCOL §3.1: a line typed during a reply goes into the running run."""
        assert self.follow.run is not None
        await self.send("input.steer", run_id=self.follow.run.run_id, input={"text": text})

    async def queue_run(self, text: str) -> None:
        """`/queue TEXT`: a run the driver holds and starts once the runs before it end."""
        queued = new_run()
        self.follow.queued.append(queued)
        await self.send("input.start", queued.command_id, run_id=queued.run_id, input={"text": text}, queue=True)
        self.say(f"[dev] queued {queued.run_id}: it starts when the run before it ends")

    async def open_shell(self) -> None:
        """A login shell in a terminal beside the agent (PROTOCOL §6.8): the web console shows a pane
        for it as soon as the driver reports process.started. Runs or not, it goes at once."""
        process_id = f"shell-{uuid.uuid4().hex[:8]}"
        await self.send("process.start", process_id=process_id, argv=[], pty={"cols": SHELL_COLS, "rows": SHELL_ROWS})
        self.say(f"[dev] shell {process_id} opens in the web console (the console URL above)")

    def console_link(self) -> None:
        """`/link`: a new one-time login link to the web console. The console's token lives in this
        process's memory only, so once the banner's link is used (or opened in another browser) this
        is the way back in."""
        url = self.cp.console_login_url()
        self.say(f"[dev] console login link (works once): {url}" if url else "[dev] the web console is off")

    async def stop(self, why: str) -> None:
        if self.phase == "stopping":
            return
        self.phase = "stopping"
        dropped = sum(1 for kind, _ in self.waiting if kind == "input")
        self.waiting.clear()
        self.say(f"[dev] stopping the session ({why}){f'; {dropped} typed input(s) dropped' if dropped else ''}")
        self._spawn(self._stop_watchdog())
        await self.send("session.stop", reason=f"dev: {why}")

    async def _stop_watchdog(self) -> None:
        await asyncio.sleep(STOP_TIMEOUT_S)
        self.say(f"[dev] the driver did not stop within {STOP_TIMEOUT_S:.0f} s; terminating it")
        await end_process(self.driver)

    async def _ready_watchdog(self) -> None:
        await asyncio.sleep(READY_TIMEOUT_S)
        if self.phase == "starting":
            self.say(f"[dev] the driver was not ready within {READY_TIMEOUT_S:.0f} s; see {self.paths.driver_log}")
            self.push(("stop", "not ready"))

    async def _watch_driver(self) -> None:
        self.push(("driver_exited", await self.driver.wait()))

    def _spawn(self, coro: Any) -> None:
        self._tasks.append(asyncio.ensure_future(coro))

    # -- the loop -------------------------------------------------------------------------------
    async def serve(self, sub: Subscription) -> int:
        """Run until the driver has exited; the exit status of `agent-driver dev`."""
        self._spawn(self.pump.run(sub))
        self._spawn(self._watch_driver())
        self._spawn(self._ready_watchdog())
        try:
            while True:
                kind, value = await self.actions.get()
                result = await self.handle(kind, value)
                if result is not None:
                    return result
        finally:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def handle(self, kind: str, value: Any) -> int | None:
        if kind == "driver_exited":
            return self._driver_exited(int(value))
        if kind == "interrupt":
            if self.prompts:
                self.transcript.mark_line_start(False)  # the terminal echoed "^C" where the cursor was
            await self._interrupt()
        elif kind == "stop":
            await self.stop(str(value))
        elif kind == "ready":
            await self._ready()
        elif kind == "run_ended":
            await self._run_ended(str(value))
        elif kind == "permission":
            if self.asking.add(value):
                await self._ask_permission()
        elif kind == "permission_settled":
            await self._permission_settled(value)
        elif kind == "elsewhere":
            self._queued_elsewhere(str(value))
        elif kind == "line":
            if self.prompts:
                self.transcript.mark_line_start(True)  # the terminal echoed the user's Enter
            await self._line(str(value))
        elif kind == "eof":
            self.stdin_open = False
            if self.asking:
                await self._answer_permission(False, "stdin closed")
            self.waiting.append(("quit", None))
            await self._next_waiting()
        return None

    async def _ready(self) -> None:
        if self.phase != "starting":
            return  # driver.started comes once per driver process; nothing to redo
        self.phase = "idle"
        self.status.connected = self.cp.connected(self.instance_id)
        if self.once is not None:
            await self.start_run(self.once)
            return
        await self._next_waiting()
        self.prompt()

    async def _run_ended(self, terminal: str) -> None:
        run = self.follow.run
        if run is None:
            return
        self.status.last_run, self.status.last_terminal = run.run_id, terminal.removeprefix("run.")
        self.follow.run = None
        self.asking.clear()
        self.say(self.status.line(time.monotonic()))
        if self.follow.queued and self.phase == "running":
            ended = self.follow.follow_next()  # the driver starts it now: follow it
            if ended is not None:
                await self._run_ended(ended)
            return
        if self.phase == "running":
            self.phase = "idle"
        if self.once is not None:
            await self.stop("--once run ended")
            return
        await self._next_waiting()
        self.prompt()

    async def _next_waiting(self) -> None:
        """Start what was typed ahead, if the driver is idle."""
        if self.phase != "idle" or not self.waiting:
            return
        kind, value = self.waiting.popleft()
        if kind == "quit":
            await self.stop("user quit")
        else:
            await self.start_run(str(value))

    async def _line(self, raw: str) -> None:
        if self.asking:
            allow = typed.answer(raw)
            if allow is None:
                self.say("[permission] please answer y or n")
                self._ask_again()
            else:
                await self._answer_permission(allow, "")
            return
        line = typed.parse(raw)
        if line.kind == "status":
            self.say(self.status.line(time.monotonic()))
            self.say(self.status.activity_line())
        elif line.kind == "help":
            self.say(HELP)
        elif line.kind == "shell":
            await self.open_shell()
        elif line.kind == "link":
            self.console_link()
        elif line.kind == "quit":
            if self.phase == "running":
                self.say("[dev] quitting when this run ends (Ctrl-C cancels it)")
            self.waiting.append(("quit", None))
        elif line.kind == "queue":
            if not line.text:
                self.say("[dev] /queue TEXT queues TEXT behind the running reply")
            elif self.phase == "running" and self.follow.run is not None:
                await self.queue_run(line.text)
            else:
                self.waiting.append(("input", line.text))
        elif line.kind == "say":
            run = self.follow.run
            if self.phase == "running" and run is not None and not run.cancel_sent:
                await self.steer(line.text)
                return
            if self.phase in ("starting", "running"):
                self.say("[dev] waiting: it is sent when the driver is free")
            self.waiting.append(("input", line.text))
        await self._next_waiting()
        self.prompt()

    async def _interrupt(self) -> None:
        run, queued_runs = self.follow.run, self.follow.queued
        if self.phase == "stopping":
            self.say("[dev] terminating the driver")
            await end_process(self.driver)
        elif run is not None and not run.cancel_sent:
            run.cancel_sent = True
            # Typed-ahead inputs go with the cancelled run; a typed-ahead /quit stays.
            dropped = sum(1 for kind, _ in self.waiting if kind == "input") + len(queued_runs)
            self.waiting = deque(a for a in self.waiting if a[0] != "input")
            note = f"; {dropped} queued input(s) dropped" if dropped else ""
            self.say(f"[dev] cancelling {run.run_id} (Ctrl-C again to quit){note}")
            # The runs queued in the driver first, so none of them starts when this one ends.
            while queued_runs:
                queued = queued_runs.popleft()
                await self.send("turn.cancel", run_id=queued.run_id, reason="user pressed Ctrl-C")
            await self.send("turn.cancel", run_id=run.run_id, reason="user pressed Ctrl-C")
        else:
            await self.stop("Ctrl-C")

    def _queued_elsewhere(self, command_id: str) -> None:
        """A command the web console queued: show it, and follow a run it started like one typed here
        (its end prompts again, Ctrl-C cancels it, lines typed meanwhile wait for it)."""
        cmd = self.cp.command(command_id)
        if cmd is None or self.phase == "stopping":
            return
        body = cmd["body"]
        if cmd["kind"] == "session.stop":
            self.phase = "stopping"  # its exit is then the clean end of this chat too
            self.waiting.clear()
            self.say("[console] session.stop: the driver is stopping")
            self._spawn(self._stop_watchdog())
            return
        text = (body.get("input") or {}).get("text", "")
        if cmd["kind"] == "input.steer":
            self.say(f"[console] steer: {text}")
            return
        if cmd["kind"] != "input.start":
            self.say(f"[console] {cmd['kind']}")
            return
        self.say(f"{CONSOLE_PREFIX}{text}")
        followed = Followed(str(body.get("run_id")), command_id)
        if self.phase == "idle" and self.follow.run is None:
            self.follow.run = followed
            self.phase = "running"
        elif body.get("queue") and self.phase == "running":
            self.follow.queued.append(followed)  # followed after the current one

    # -- permissions ----------------------------------------------------------------------------
    async def _ask_permission(self) -> None:
        request = self.asking.head()
        self.say(f"[permission] the agent asks: {short(request.get('title') or 'a tool call', 160)}")
        if not self.stdin_open:
            await self._answer_permission(False, "--once does not ask" if self.once is not None else "stdin is closed")
            return
        self._ask_again()

    def _ask_again(self) -> None:
        if self.prompts:
            self.write("allow? [y/n] ")
            self.transcript.mark_line_start(False)
        else:
            self.say("[permission] answer y or n")

    async def _answer_permission(self, allow: bool, why: str) -> None:
        request, option_id = self.asking.take(allow)
        if option_id is None:
            self.say(f"[permission] no {'allow' if allow else 'reject'} option was offered; leaving it to time out")
        else:
            self.say(f"[permission] {'allowed' if allow else 'rejected'}{f' ({why})' if why else ''}")
            await self.send("permission.resolve", request_id=request.get("request_id"), option_id=option_id)
        if self.asking:
            await self._ask_permission()

    async def _permission_settled(self, resolved: Mapping[str, Any]) -> None:
        """Resolved without us (timeout, cancel, the web console): stop asking about it."""
        settled = self.asking.settle(resolved)
        if settled.from_console:
            self.say(f"[permission] {resolved.get('outcome')} in the console")
        if settled.ask_next:
            await self._ask_permission()

    # -- the end --------------------------------------------------------------------------------
    def _driver_exited(self, code: int) -> int:
        if self.phase == "stopping" and code == 0:
            self.say("[dev] the driver stopped cleanly; bye")
            if self.once is not None:
                return 0 if self.status.last_terminal == "completed" else 1
            return 0
        self.say(f"[dev] the driver exited with status {code}; the end of {self.paths.driver_log}:")
        for line in log_tail(self.paths.driver_log):
            self.say("    " + line)
        return 1
