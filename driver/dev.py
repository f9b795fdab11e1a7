"""`agent-driver dev`: the driver with an embedded reference control plane and a terminal chat.

It is the product as a sandbox runs it, on one machine: the reference control plane runs in this
process (its SQLite store under the work dir), a one-time boot file is written, and `agent-driver run`
starts as a separate process that dials the control plane, exactly as in a sandbox. The chat talks to
the driver only through control-plane commands and reads only what the control plane stored, so what
you see is what a real control plane would see. Without a provider API key the model is the offline
fake from `driver/testing/`, and the first line of output says so.

The work dir (default ./.dev):
    controlplane.sqlite3        every stored event and command of every dev session
    workspace/                  the agent's working directory (shared by dev sessions)
    memory/                     the pet session's memory_dir
    sessions/<instance>/        the driver's state_dir, driver.log (its stderr), controlplane.log
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import io
import json
import os
import secrets
import signal
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from driver.testing import codex_acp

if TYPE_CHECKING:
    from driver.controlplane.live import Subscription
    from driver.controlplane.server import ControlPlane

READY_TIMEOUT_S = 120.0  # the provider may take a while on a cold machine (Claude's CLI is 200 MB)
STOP_TIMEOUT_S = 45.0  # session.stop drains the outbox; after this the driver is terminated
KILL_GRACE_S = 5.0
HEARTBEAT_MS = 1000  # frequent, so /status shows fresh outbox counts
PERMISSION_TIMEOUT_MS = 15 * 60 * 1000  # a person answers these, not a program
RUN_TERMINALS = frozenset({"run.completed", "run.failed", "run.cancelled"})
AGENT_PREFIX = "agent> "
THINKING_PREFIX = "thinking> "
USER_PROMPT = "you> "
CONSOLE_PREFIX = "console> "  # input typed in the web console
# Credentials the driver process itself never needs: they reach the provider through the boot payload.
PROVIDER_SECRETS = frozenset({"ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "OPENAI_API_KEY", "CODEX_API_KEY"})
OFFLINE_MARKERS = "try [[say:TEXT]], [[shell:CMD]], [[write:PATH:TEXT]], [[think]], or [[slow]] then Ctrl-C"
HELP = "Type a message and press Enter. /status shows the link; /quit or Ctrl-D leaves; Ctrl-C cancels a reply."

Action = tuple[str, Any]  # (kind, value): what the chat loop reacts to, from stdin, signals and the pump


class DevError(Exception):
    """A problem worth one clear line (and exit status 1), not a traceback."""


# --------------------------------------------------------------------------------------------------
# Where things live


@dataclass(frozen=True)
class DevPaths:
    workdir: Path
    instance_id: str

    @property
    def db(self) -> Path:
        return self.workdir / "controlplane.sqlite3"

    @property
    def workspace(self) -> Path:
        return self.workdir / "workspace"

    @property
    def memory(self) -> Path:
        return self.workdir / "memory"

    @property
    def session_dir(self) -> Path:
        return self.workdir / "sessions" / self.instance_id

    @property
    def state_dir(self) -> Path:
        return self.session_dir / "state"

    @property
    def boot_file(self) -> Path:
        return self.session_dir / "boot.json"

    @property
    def driver_log(self) -> Path:
        return self.session_dir / "driver.log"

    @property
    def cp_log(self) -> Path:
        return self.session_dir / "controlplane.log"

    def create(self) -> None:
        for folder in (self.workspace, self.memory):
            folder.mkdir(parents=True, exist_ok=True)
        # The session dir briefly holds the boot file (with the control token): owner only.
        self.session_dir.mkdir(parents=True, mode=0o700)
        self.state_dir.mkdir(mode=0o700)


def new_command_id() -> str:
    return f"cmd-dev-{uuid.uuid4().hex[:16]}"


def new_instance_id() -> str:
    """Unique per dev run, so every run starts at epoch 1 with a state dir of its own."""
    return f"drv-dev-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(2)}"


# --------------------------------------------------------------------------------------------------
# The provider: the real API when its key is set, else the offline fake model endpoint


@dataclass
class ProviderSetup:
    notice: str  # the first line of output: which model endpoint answers
    environment: dict[str, str]  # execution.environment: given to the provider process only
    model: str = ""
    provider_options: dict[str, Any] = field(default_factory=dict)
    acp: dict[str, Any] | None = None


def _offline_notice(key_name: str, api: str, base_url: str) -> str:
    return (
        f"OFFLINE: {key_name} is not set, so replies come from the fake {api} endpoint at {base_url} "
        f"({OFFLINE_MARKERS})."
    )


def prepare_provider(
    runtime: str, paths: DevPaths, env: Mapping[str, str], stack: contextlib.ExitStack
) -> ProviderSetup:
    """Configure the runtime; a fake endpoint it starts is closed by `stack`."""
    if runtime == "claude-agent-sdk":
        return _claude(env, stack)
    if runtime == "openai-app-server":
        return _codex(env, stack)
    if runtime == "acp":
        return _codex_acp(paths, env, stack)
    raise DevError(f"unknown runtime {runtime!r}")


def _claude(env: Mapping[str, str], stack: contextlib.ExitStack) -> ProviderSetup:
    key = env.get("ANTHROPIC_API_KEY")
    if key:
        environment = {"ANTHROPIC_API_KEY": key}
        notice = "Using the real Anthropic API (ANTHROPIC_API_KEY is set)."
        if env.get("ANTHROPIC_BASE_URL"):
            environment["ANTHROPIC_BASE_URL"] = env["ANTHROPIC_BASE_URL"]
            notice = f"Using the Anthropic API at {env['ANTHROPIC_BASE_URL']} (ANTHROPIC_API_KEY is set)."
        return ProviderSetup(notice, environment)
    from driver.testing.fake_anthropic import FakeAnthropic

    fake = stack.enter_context(FakeAnthropic())
    # The adapter adds the switches that keep the CLI on this one endpoint (see claude_options).
    return ProviderSetup(
        _offline_notice("ANTHROPIC_API_KEY", "Anthropic Messages", fake.base_url),
        {"ANTHROPIC_BASE_URL": fake.base_url, "ANTHROPIC_API_KEY": "sk-ant-dev-offline-key"},
        model="claude-sonnet-4-5",
    )


def _openai_endpoint(env: Mapping[str, str], stack: contextlib.ExitStack) -> tuple[str, str | None, str]:
    """(notice, base URL or None for the provider's default, API key)."""
    key = env.get("OPENAI_API_KEY")
    if key:
        base_url = env.get("OPENAI_BASE_URL")
        where = f"the OpenAI API at {base_url}" if base_url else "the real OpenAI API"
        return f"Using {where} (OPENAI_API_KEY is set).", base_url, key
    from driver.testing.fake_responses import FakeResponses

    fake = stack.enter_context(FakeResponses())
    notice = _offline_notice("OPENAI_API_KEY", "OpenAI Responses", fake.base_url)
    return notice, fake.base_url, "sk-dev-offline-key"


def _codex(env: Mapping[str, str], stack: contextlib.ExitStack) -> ProviderSetup:
    if importlib.util.find_spec("driver.adapters.codex") is None:
        raise DevError("the openai-app-server adapter is not part of this build yet; try --runtime claude-agent-sdk")
    notice, base_url, key = _openai_endpoint(env, stack)
    options: dict[str, Any] = {"env_key": "OPENAI_API_KEY"}
    if base_url:
        options["base_url"] = base_url
    return ProviderSetup(notice, {"OPENAI_API_KEY": key}, provider_options=options)


def codex_acp_binary() -> Path:
    from driver.kernel import project_root

    found = codex_acp.binary(project_root())
    if found is None:
        raise DevError(f"codex-acp is not installed under {project_root() / 'node_modules'}; run `make setup`")
    return found


def _codex_acp(paths: DevPaths, env: Mapping[str, str], stack: contextlib.ExitStack) -> ProviderSetup:
    """The `acp` runtime with codex-acp as the agent, configured through its own CODEX_HOME."""
    binary = codex_acp_binary()
    notice, base_url, key = _openai_endpoint(env, stack)
    home = paths.session_dir / "codex-home"
    tmp = paths.session_dir / "tmp"  # codex-acp will not install its sandbox helper under /tmp
    tmp.mkdir(mode=0o700, exist_ok=True)
    offline = not env.get("OPENAI_API_KEY")
    codex_acp.write_home(
        home, base_url or "https://api.openai.com/v1", model=codex_acp.OFFLINE_MODEL if offline else None
    )
    acp = {"command": [str(binary)], "env": {"CODEX_HOME": str(home), "TMPDIR": str(tmp)}}
    return ProviderSetup(notice, {"OPENAI_API_KEY": key}, acp=acp)


# --------------------------------------------------------------------------------------------------
# The boot payload and the driver process


def boot_payload(
    paths: DevPaths, control_url: str, token: str, runtime: str, provider: ProviderSetup
) -> dict[str, Any]:
    """A pet session with no idle exit: the driver must not leave while the user is typing."""
    execution: dict[str, Any] = {
        "revision": "rev-dev",
        "runtime": runtime,
        "model": provider.model,
        "permission_policy": "supervised",
        "permission_timeout_ms": PERMISSION_TIMEOUT_MS,
        "environment": provider.environment,
        "provider_options": provider.provider_options,
    }
    if provider.acp is not None:
        execution["acp"] = provider.acp
    return {
        "protocol": 1,
        "driver_instance_id": paths.instance_id,
        "control": {"url": control_url, "token": token},
        "session": {
            "id": "ses-" + paths.instance_id.removeprefix("drv-"),
            "agent_id": "agt-dev",
            "kind": "pet",
            "cwd": str(paths.workspace),
            "state_dir": str(paths.state_dir),
            "memory_dir": str(paths.memory),
            "idle_exit_ms": None,
        },
        "execution": execution,
    }


def write_boot_file(path: Path, payload: Mapping[str, Any]) -> None:
    """Create the file with mode 0600 from the start (never a moment readable by others)."""
    from driver.protocol.boot import BOOT_DECODER

    data = json.dumps(payload).encode()
    BOOT_DECODER.decode(data)  # a mistake here should fail in dev, with a traceback, not in the driver
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def driver_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The driver's own environment: ours minus boot-file/token variables and provider credentials."""
    from driver.adapters.environment import FORBIDDEN

    return {k: v for k, v in env.items() if k not in FORBIDDEN and k not in PROVIDER_SECRETS}


async def launch_driver(paths: DevPaths, env: Mapping[str, str]) -> asyncio.subprocess.Process:
    """`agent-driver run` as a real process, in a session of its own so the terminal's Ctrl-C reaches
    only this chat (which turns it into a command), never the driver."""
    with paths.driver_log.open("ab") as log:
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "driver.cli",
            "run",
            "--boot-file",
            str(paths.boot_file),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=driver_environment(env),
            cwd=str(paths.workspace),
            start_new_session=True,
        )


async def end_process(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM the driver's process group, SIGKILL it if it lingers."""
    for sig, grace in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, KILL_GRACE_S)):
        if proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), grace)


def log_tail(path: Path, lines: int = 12) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []


# --------------------------------------------------------------------------------------------------
# What the terminal shows (no I/O)


def _short(value: Any, limit: int = 100) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def choose_option(options: Sequence[Mapping[str, Any]], allow: bool) -> str | None:
    """The option id to answer with, chosen by kind (never by position): once before always."""
    wanted = ("allow_once", "allow_always") if allow else ("reject_once", "reject_always")
    for kind in wanted:
        for option in options:
            if option.get("kind") == kind:
                return str(option.get("option_id"))
    return None


@dataclass
class Status:
    """What `/status` and the line after each run show."""

    connected: bool = False
    lossless_pending: int | None = None
    best_effort_dropped: int | None = None
    last_run: str | None = None
    last_terminal: str | None = None
    heartbeat_at: float | None = None  # time.monotonic() when the last heartbeat arrived
    activity: Mapping[str, Any] | None = None  # the last heartbeat's `activity` (the provider tree)

    def heartbeat(self, beat: Mapping[str, Any], now: float) -> None:
        self.activity = beat.get("activity")
        outbox = beat.get("outbox") or {}
        self.lossless_pending = outbox.get("lossless_pending")
        self.best_effort_dropped = outbox.get("best_effort_dropped")
        self.heartbeat_at = now

    def line(self, now: float) -> str:
        link = "connected" if self.connected else "not connected"
        if self.lossless_pending is None or self.heartbeat_at is None:
            outbox = "no heartbeat yet"
        else:
            outbox = (
                f"{self.lossless_pending} lossless pending, {self.best_effort_dropped} best-effort dropped "
                f"(heartbeat {now - self.heartbeat_at:.1f} s ago)"
            )
        run = "none yet" if self.last_run is None else f"{self.last_run} {self.last_terminal or 'running'}"
        return f"[status] link {link} | outbox {outbox} | last run {run}"

    def activity_line(self) -> str:
        from driver.telemetry.activity import describe

        return f"[activity] {describe(self.activity)}"


class Transcript:
    """Turns stored events into terminal text. Best-effort deltas (of messages and of thoughts) are
    printed as they arrive; the lossless `*.completed` arbitrates: what the deltas missed is printed
    then, and if they disagree with it the whole text is printed again. A note never lands inside a
    streamed line: the open line is ended first and the stream resumes with its prefix again."""

    def __init__(self, color: bool = False) -> None:
        self.color = color
        self._shown: dict[str, str] = {}  # stream id ("m:<message_id>", "t:<thought_id>") -> text shown
        self._closed: set[str] = set()
        self._not_assistant: set[str] = set()
        self._open: str | None = None  # the stream whose line the cursor is on
        self._at_line_start = True
        self._tools: dict[str, str] = {}
        self._messages_in_run = 0

    def mark_line_start(self, at_start: bool) -> None:
        """Tell where the cursor is after something written outside (a prompt, the user's Enter)."""
        self._at_line_start = at_start
        self._open = None

    def line(self, text: str) -> str:
        """`text` on a line of its own."""
        out = "" if self._at_line_start else "\n"
        self._open = None
        self._at_line_start = True
        if self.color:
            text = f"\x1b[2m{text}\x1b[0m"
        return out + text + "\n"

    def event(self, event: Mapping[str, Any]) -> str:
        kind = str(event.get("kind"))
        payload: Mapping[str, Any] = event.get("payload") or {}
        message = f"m:{payload.get('message_id')}"
        thought = f"t:{payload.get('thought_id')}"
        if kind == "run.started":
            self._messages_in_run = 0
        elif kind == "message.started":
            if payload.get("role") != "assistant":
                self._not_assistant.add(message)
            return ""
        elif kind == "message.delta":
            return self._delta(message, str(payload.get("text") or ""), AGENT_PREFIX)
        elif kind == "thought.delta":
            return self._delta(thought, str(payload.get("text") or ""), THINKING_PREFIX)
        elif kind == "message.completed":
            if message in self._not_assistant or payload.get("role", "assistant") != "assistant":
                self._closed.add(message)
                return ""
            return self._completed(message, str(payload.get("text") or ""), AGENT_PREFIX)
        elif kind == "thought.completed":
            return self._completed(thought, str(payload.get("text") or ""), THINKING_PREFIX)
        elif kind == "run.completed" and self._messages_in_run == 0 and payload.get("final_message_text"):
            # No message events came through (a provider without them): the terminal carries the text.
            final = f"m:final:{event.get('run_id')}"
            return self._completed(final, str(payload["final_message_text"]), AGENT_PREFIX)
        note = self._note(kind, payload)
        return self.line(note) if note else ""

    def _write(self, stream: str, text: str, prefix: str) -> str:
        out = ""
        if self._open != stream:
            out = ("" if self._at_line_start else "\n") + prefix
            self._open = stream
        out += text
        self._at_line_start = out.endswith("\n")
        return out

    def _delta(self, stream: str, text: str, prefix: str) -> str:
        if not text or stream in self._closed or stream in self._not_assistant:
            return ""
        self._shown[stream] = self._shown.get(stream, "") + text
        return self._write(stream, text, prefix)

    def _completed(self, stream: str, full: str, prefix: str) -> str:
        if stream in self._closed:
            return ""
        self._closed.add(stream)
        shown = self._shown.pop(stream, "")
        if not full and not shown:
            return ""
        if prefix == AGENT_PREFIX:
            self._messages_in_run += 1
        if full == shown:
            # All of it was shown. End its line if the cursor is still on it; leave any other alone.
            if self._open != stream:
                return ""
            out = ""
        elif full.startswith(shown):
            out = self._write(stream, full[len(shown) :], prefix)
        else:
            # The deltas said something else (lost or reordered): the completed text is the truth.
            self._open = None
            out = self._write(stream, full, prefix)
        if not self._at_line_start:
            out += "\n"
        self._open = None
        self._at_line_start = True
        return out

    def _note(self, kind: str, p: Mapping[str, Any]) -> str | None:
        if kind == "driver.started":
            timings = p.get("timings") or {}
            started = timings.get("provider_start_ms")
            if started is None:
                return f"[driver] up, but the {p.get('runtime')} provider did not start (see the diagnostic above)"
            return f"[driver] ready: {p.get('runtime')} started in {started:.0f} ms (boot {timings.get('boot_ms')} ms)"
        if kind == "run.failed":
            error = p.get("error") or {}
            return f"[run failed] {error.get('code')}: {error.get('message')}"
        if kind == "run.cancelled":
            details = p.get("details") or {}
            return f"[run cancelled] by {p.get('requested_by')} (phase: {details.get('phase')})"
        if kind == "tool.started":
            tool_id = str(p.get("tool_call_id"))
            name = str(p.get("name") or "tool")
            self._tools[tool_id] = name
            detail = _short(p.get("title") or p.get("input") or "")
            # Titles often name the tool already ("Bash: Run ls"): do not say it twice.
            return f"[tool] {detail}" if detail.startswith(name) else f"[tool] {name}: {detail}"
        if kind == "tool.completed":
            name = self._tools.get(str(p.get("tool_call_id")), "tool")
            status, code = p.get("status"), p.get("exit_code")
            if status == "completed" and code in (None, 0):
                return None
            return f"[tool] {name} {status}" + ("" if code is None else f" (exit {code})")
        if kind == "permission.resolved":
            if p.get("decided_by") == "control_plane":
                return None  # the chat said so when the user answered, in the order the user saw
            return f"[permission] {p.get('outcome')} (decided by {p.get('decided_by')})"
        if kind == "file.changed":
            return f"[file] {p.get('change')} {p.get('path')}"
        if kind == "artifact.produced":
            return f"[artifact] {p.get('path')} ({p.get('size')} bytes)"
        if kind == "plan.updated":
            entries = p.get("entries") or []
            return "[plan] " + _short("; ".join(f"{e.get('status')}: {e.get('content')}" for e in entries), 160)
        if kind == "diagnostic.reported":
            return f"[{p.get('severity')}] {p.get('code')}: {p.get('message')}"
        if kind == "runtime.session.reset":
            return "[session] the provider could not resume and started a fresh session"
        if kind == "host_tool.called":
            return f"[host tool] {p.get('name')} was called, but dev offers no host tools"
        return None


# --------------------------------------------------------------------------------------------------
# The chat: one loop over actions (lines, signals, and what the control plane reports)


@dataclass
class _Run:
    run_id: str
    command_id: str
    cancel_sent: bool = False
    terminal_seen: bool = False


class DevChat:
    """Sends commands through the control plane and shows the events it stores.

    Every state change happens in `serve`'s loop, one action at a time: typed lines, Ctrl-C, the
    driver's exit, and the pump's notices (ready, run ended, permission asked). Lines typed while a
    run is active wait their turn, so a script can type ahead and `/quit` last.
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
        self.run: _Run | None = None
        self.waiting: deque[Action] = deque()  # typed ahead: ("input", text) | ("quit", None)
        self.permissions: deque[Mapping[str, Any]] = deque()
        self.stdin_open = once is None
        self.link_lost = False
        self.commands: dict[str, str] = {}  # command id -> kind, for commands this chat sent
        self._tasks: list[asyncio.Task[None]] = []

    # -- output ---------------------------------------------------------------------------------
    def write(self, text: str) -> None:
        if text:
            self.out.write(text)
            self.out.flush()

    def say(self, text: str) -> None:
        self.write(self.transcript.line(text))

    def prompt(self) -> None:
        if self.prompts and self.phase == "idle" and not self.waiting and not self.permissions:
            self.write(USER_PROMPT)
            self.transcript.mark_line_start(False)

    def push(self, action: Action) -> None:
        self.actions.put_nowait(action)

    # -- the pump: control-plane items -> output and actions --------------------------------------
    async def pump(self, sub: Subscription) -> None:
        try:
            async for item in sub:
                kind = item.get("type")
                if kind == "event":
                    self._on_event(item)
                elif kind == "heartbeat":
                    self.status.heartbeat(item, time.monotonic())
                elif kind == "link":
                    self._on_link(item)
                elif kind == "command.update":
                    self._on_update(item)
                elif kind == "command" and item.get("command_id") not in self.commands:
                    self.push(("elsewhere", item.get("command_id")))
        except Exception as exc:  # a bug here must not leave the user typing into a dead chat
            self.say(f"[dev] internal error while showing events: {type(exc).__name__}: {exc}")
            self.push(("stop", "internal error"))

    def _on_event(self, event: Mapping[str, Any]) -> None:
        self.write(self.transcript.event(event))
        kind = event["kind"]
        run = self.run
        if kind == "driver.started":
            self.push(("ready", None))
        elif kind in RUN_TERMINALS and run is not None and event.get("run_id") == run.run_id:
            run.terminal_seen = True
            self.push(("run_ended", kind))
        elif kind == "permission.requested":
            self.push(("permission", event["payload"]))
        elif kind == "permission.resolved":
            self.push(("permission_settled", event["payload"]))

    def _on_link(self, item: Mapping[str, Any]) -> None:
        self.status.connected = item.get("state") == "up"
        if self.phase == "stopping":
            return
        if not self.status.connected:
            self.link_lost = True
            self.say(f"[link] down (close code {item.get('close_code')}); the driver reconnects by itself")
        elif self.link_lost:
            self.link_lost = False
            self.say("[link] up again")

    def _on_update(self, item: Mapping[str, Any]) -> None:
        kind = self.commands.get(str(item.get("command_id")))
        if kind is None or item.get("status") != "failed":
            return
        error = item.get("error") or {}
        run = self.run
        if kind == "input.start":
            if run is None or run.command_id != item.get("command_id") or run.terminal_seen:
                return  # the run's own terminal event already told the story
            run.terminal_seen = True
            self.say(f"[input refused] {error.get('code')}: {error.get('message')}")
            self.push(("run_ended", "refused"))
            return
        self.say(f"[{kind} failed] {error.get('code')}: {error.get('message')}")

    # -- commands -------------------------------------------------------------------------------
    async def send(self, kind: str, command_id: str | None = None, **fields: Any) -> None:
        command_id = command_id or new_command_id()
        self.commands[command_id] = kind  # before sending: its update may come back at once
        await self.cp.send_command(self.instance_id, kind, command_id=command_id, **fields)

    async def start_run(self, text: str) -> None:
        """A new run id each time; the run is known before its command goes out, so no event of
        it can arrive unrecognised."""
        self.run = _Run(f"run-{uuid.uuid4().hex[:12]}", new_command_id())
        self.phase = "running"
        await self.send("input.start", self.run.command_id, run_id=self.run.run_id, input={"text": text})

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
        self._spawn(self.pump(sub))
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
            self.permissions.append(value)
            if len(self.permissions) == 1:
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
            if self.permissions:
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
        run = self.run
        if run is None:
            return
        self.status.last_run, self.status.last_terminal = run.run_id, terminal.removeprefix("run.")
        self.run = None
        self.permissions.clear()
        if self.phase == "running":
            self.phase = "idle"
        self.say(self.status.line(time.monotonic()))
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
        text = raw.rstrip("\r\n")
        if self.permissions:
            answer = text.strip().lower()
            if answer in ("y", "yes", "n", "no"):
                await self._answer_permission(answer.startswith("y"), "")
            else:
                self.say("[permission] please answer y or n")
                self._ask_again()
            return
        command = text.strip()
        if command == "/status":
            self.say(self.status.line(time.monotonic()))
            self.say(self.status.activity_line())
        elif command == "/help":
            self.say(HELP)
        elif command in ("/quit", "/exit"):
            if self.phase == "running":
                self.say("[dev] quitting when this run ends (Ctrl-C cancels it)")
            self.waiting.append(("quit", None))
        elif command:
            if self.phase in ("starting", "running"):
                self.say("[dev] queued: it is sent when the driver is free")
            self.waiting.append(("input", text))
        await self._next_waiting()
        self.prompt()

    async def _interrupt(self) -> None:
        run = self.run
        if self.phase == "stopping":
            self.say("[dev] terminating the driver")
            await end_process(self.driver)
        elif run is not None and not run.cancel_sent:
            run.cancel_sent = True
            # Typed-ahead inputs go with the cancelled run; a typed-ahead /quit stays.
            dropped = sum(1 for kind, _ in self.waiting if kind == "input")
            self.waiting = deque(a for a in self.waiting if a[0] != "input")
            note = f"; {dropped} queued input(s) dropped" if dropped else ""
            self.say(f"[dev] cancelling {run.run_id} (Ctrl-C again to quit){note}")
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
        if cmd["kind"] != "input.start":
            self.say(f"[console] {cmd['kind']}")
            return
        self.say(f"{CONSOLE_PREFIX}{(body.get('input') or {}).get('text', '')}")
        if self.phase == "idle" and self.run is None:
            self.run = _Run(str(body.get("run_id")), command_id)
            self.phase = "running"

    # -- permissions ----------------------------------------------------------------------------
    async def _ask_permission(self) -> None:
        request = self.permissions[0]
        self.say(f"[permission] the agent asks: {_short(request.get('title') or 'a tool call', 160)}")
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
        request = self.permissions.popleft()
        option_id = choose_option(request.get("options") or [], allow)
        if option_id is None:
            self.say(f"[permission] no {'allow' if allow else 'reject'} option was offered; leaving it to time out")
        else:
            self.say(f"[permission] {'allowed' if allow else 'rejected'}{f' ({why})' if why else ''}")
            await self.send("permission.resolve", request_id=request.get("request_id"), option_id=option_id)
        if self.permissions:
            await self._ask_permission()

    async def _permission_settled(self, resolved: Mapping[str, Any]) -> None:
        """Resolved without us (timeout, cancel, the web console): stop asking about it."""
        request_id = resolved.get("request_id")
        head = self.permissions[0].get("request_id") if self.permissions else None
        if resolved.get("decided_by") == "control_plane" and any(
            p.get("request_id") == request_id for p in self.permissions
        ):
            # Still asked here, so the answer came from elsewhere: the web console.
            self.say(f"[permission] {resolved.get('outcome')} in the console")
        self.permissions = deque(p for p in self.permissions if p.get("request_id") != request_id)
        if head == request_id and self.permissions:
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


# --------------------------------------------------------------------------------------------------
# Terminal plumbing


def start_stdin_reader(loop: asyncio.AbstractEventLoop, push: Callable[[Action], None]) -> None:
    """Read stdin lines in a daemon thread. `os.read` (not `sys.stdin`) so that an exit while the
    thread is blocked does not fight over the buffered reader's lock at interpreter shutdown."""

    def deliver(action: Action) -> bool:
        try:
            loop.call_soon_threadsafe(push, action)
        except RuntimeError:  # the loop is closed: we are exiting
            return False
        return True

    def read() -> None:
        pending = b""
        while True:
            try:
                chunk = os.read(0, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                if pending:
                    deliver(("line", pending.decode(errors="replace")))
                deliver(("eof", None))
                return
            pending += chunk
            while b"\n" in pending:
                line, _, pending = pending.partition(b"\n")
                if not deliver(("line", line.decode(errors="replace"))):
                    return

    threading.Thread(target=read, name="dev-stdin", daemon=True).start()


@contextlib.contextmanager
def signals_to_actions(loop: asyncio.AbstractEventLoop, push: Callable[[Action], None]) -> Any:
    """Ctrl-C becomes an action (cancel the run, or quit); SIGTERM/SIGHUP stop the session."""
    handlers = {
        signal.SIGINT: ("interrupt", None),
        signal.SIGTERM: ("stop", "SIGTERM"),
        signal.SIGHUP: ("stop", "SIGHUP"),
    }
    for sig, action in handlers.items():
        loop.add_signal_handler(sig, push, action)
    try:
        yield
    finally:
        for sig in handlers:
            loop.remove_signal_handler(sig)


def _wants_color(out: TextIO) -> bool:
    return out.isatty() and not os.environ.get("NO_COLOR")


# --------------------------------------------------------------------------------------------------
# Main


@dataclass(frozen=True)
class DevOptions:
    runtime: str
    workdir: Path
    once: str | None


async def run_dev(options: DevOptions, out: TextIO, env: Mapping[str, str]) -> int:
    # Signals become actions from the very start, so Ctrl-C while starting up stops cleanly too.
    actions: asyncio.Queue[Action] = asyncio.Queue()
    with signals_to_actions(asyncio.get_running_loop(), actions.put_nowait):
        return await _run_dev(options, out, env, actions)


async def _run_dev(options: DevOptions, out: TextIO, env: Mapping[str, str], actions: asyncio.Queue[Action]) -> int:
    from driver import logs
    from driver.controlplane.cli import console_login_url
    from driver.controlplane.console import ConsoleConfig
    from driver.controlplane.server import ControlPlane

    paths = DevPaths(options.workdir.resolve(), new_instance_id())
    paths.create()
    with contextlib.ExitStack() as stack:
        provider = prepare_provider(options.runtime, paths, env, stack)
        out.write(provider.notice + "\n")
        # The in-process control plane logs to a file: the terminal is for the chat.
        logs.configure("info", stream=stack.enter_context(paths.cp_log.open("a")))
        token = secrets.token_urlsafe(32)
        console = ConsoleConfig(token=secrets.token_urlsafe(24), artifact_roots={paths.instance_id: paths.workspace})
        cp = ControlPlane(
            paths.db,
            tokens={token: {paths.instance_id}},
            http_port=0,
            heartbeat_interval_ms=HEARTBEAT_MS,
            console=console,
        )
        async with cp:
            _banner(out, options, paths, cp.url, console_login_url(str(cp.http_url), console.token, True))
            if not actions.empty():  # only a signal can be queued yet: nothing to stop
                out.write("[dev] interrupted before the driver started\n")
                return 130
            with cp.subscribe(paths.instance_id) as sub:
                write_boot_file(paths.boot_file, boot_payload(paths, cp.url, token, options.runtime, provider))
                driver = await launch_driver(paths, env)
                try:
                    chat = DevChat(
                        cp,
                        paths,
                        driver,
                        out,
                        actions,
                        once=options.once,
                        prompts=options.once is None and sys.stdin.isatty(),
                        color=_wants_color(out),
                    )
                    if options.once is None:
                        start_stdin_reader(asyncio.get_running_loop(), chat.push)
                    return await chat.serve(sub)
                finally:
                    await end_process(driver)
                    # The driver deletes the boot file as it reads it; if it never did, the token must go.
                    paths.boot_file.unlink(missing_ok=True)
    return 1  # not reached: the chat returns from inside the control plane's block


def _banner(out: TextIO, options: DevOptions, paths: DevPaths, url: str, console_url: str) -> None:
    out.write(
        f"agent-driver dev: runtime {options.runtime}{' (agent: codex-acp)' if options.runtime == 'acp' else ''}, "
        f"instance {paths.instance_id}\n"
        f"  console (web, in step with this chat): {console_url}\n"
        f"  driver log (its stderr): {paths.driver_log}\n"
        f"  control plane: {url}, events stored in {paths.db}, its log in {paths.cp_log}\n"
        f"  agent workspace: {paths.workspace}\n"
    )
    if options.once is None:
        out.write(HELP + "\n")
    out.write(f"[driver] starting {options.runtime}...\n")
    out.flush()


def main(args: argparse.Namespace) -> int:
    once: str | None = getattr(args, "once", None)
    workdir = Path(getattr(args, "workdir", None) or ".dev")
    options = DevOptions(runtime=str(args.runtime), workdir=workdir, once=once)
    out = sys.stdout
    if isinstance(out, io.TextIOWrapper):
        out.reconfigure(errors="replace")  # a model's text must never crash the chat on a narrow terminal
    try:
        return asyncio.run(run_dev(options, out, dict(os.environ)))
    except DevError as exc:
        print(f"agent-driver dev: {exc}", file=sys.stderr)
        return 1
