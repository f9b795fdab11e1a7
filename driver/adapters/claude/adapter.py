"""The `claude-agent-sdk` runtime's adapter: one Claude Code CLI per session, driven in streaming mode.

The CLI is the one the Claude Agent SDK ships (pinned); the driver speaks its stream-json wire itself
(claude_client.py), the way the SDK's `ClaudeSDKClient` does, without importing the SDK (43 MB and
0.7 s of the driver's start: docs/providers.md). The CLI's own loop is kept: a prompt goes in as a
user message, and the messages that come back (raw API stream events, whole assistant messages, tool
results, the turn's result) are mapped onto our events by `TurnTranslator`. Permission prompts arrive
as `can_use_tool` control requests on a task of their own and go through the permission port; the
turn loop keeps draining messages meanwhile.

The CLI's client and process are `claude_cli.ClaudeCli`; a permission prompt's request and answer are
`claude_permissions`, a turn's end `claude_outcome`; this module runs the session and its turns.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import anyio

from driver import logs
from driver.adapters.claude import control
from driver.adapters.claude import messages as wire
from driver.adapters.claude import permissions as claude_permissions
from driver.adapters.claude import setup as claude_setup
from driver.adapters.claude.cli import ClaudeCli, ResumeFailed
from driver.adapters.claude.client import ClaudeClient
from driver.adapters.claude.command import Session
from driver.adapters.claude.options import RUNTIME, recovery_preamble
from driver.adapters.claude.outcome import cost_share, turn_outcome
from driver.adapters.claude.turn import (
    FileTouched,
    TurnTranslator,
    init_session,
    prompts_answered,
    tool_title,
    usage_payload,
    user_message,
)
from driver.adapters.common import attachments, host_server
from driver.adapters.common.base import (
    Adapter,
    AdapterConfig,
    PathNotAllowed,
    Ports,
    ProviderError,
    SteerRefused,
    TurnOutcome,
)
from driver.adapters.common.changed_files import relative_to_cwd, sha256_of
from driver.adapters.common.protocol_diagnostics import ProtocolDiagnostics
from driver.ports.mcp_host import McpHostServer
from driver.protocol.capabilities import BY_RUNTIME
from driver.protocol.commands import RunInput

INTERRUPT_TIMEOUT_S = 5.0
# After a cancel: how long the turn waits for the CLI's answer to a steer it had taken (interrupted
# too), within the kernel's 5 s interrupt grace.
STEER_ORPHAN_S = 3.0


class ClaudeAdapter(Adapter):
    runtime: ClassVar[str] = RUNTIME
    # Declared once, in driver/protocol/capabilities.py, so `hello` can state them without importing this module.
    capabilities: ClassVar[frozenset[str]] = BY_RUNTIME["claude-agent-sdk"]

    def __init__(self, config: AdapterConfig, ports: Ports) -> None:
        super().__init__(config, ports)
        self._session_id: str | None = None  # the native session id the CLI runs
        self._announced: str | None = None  # the last id sent in runtime.resume.updated
        self._recovery_pending = ""
        # The one redactor (driver/logs.py): the token and every value of execution.environment are in it.
        logs.add(config.execution.environment.values())
        self._redact: Callable[[str], str] = logs.redact
        self._cli = ClaudeCli(self._redact)
        self._translator: TurnTranslator | None = None
        self._tools_started: set[str] = set()
        self._refused: dict[str, str] = {}
        self._cancelling = False
        self._pending_diagnostics: list[str] = []
        self._cwd = Path(config.session.cwd).resolve()
        self._cost_total = 0.0  # the CLI's running cost total at the last result
        # The prompts of the running turn still waiting for their result: the run's own and each
        # steer's (PROTOCOL §3.1). The turn is over when none is left (`_turn_over`).
        self._pending_prompts: list[str] = []
        self._turn_over = True
        self._host: McpHostServer | None = None  # the `host` MCP server of §6.3, while host tools exist
        self._protocol = ProtocolDiagnostics(ports.emit, "Claude Code")

    # -- lifecycle ---------------------------------------------------------------------------------

    @property
    def native_id(self) -> str | None:
        return self._session_id

    @property
    def connect_seconds(self) -> float | None:
        """How long the last CLI took to connect (driver.started timings)."""
        return self._cli.connect_seconds

    async def start(self) -> None:
        execution = self.config.execution
        if execution.host_tools and self._host is None:
            self._host = await host_server.start(self.config, self.ports.host_tools)
        resume = execution.native_resume
        if resume is not None and resume.runtime == RUNTIME:
            try:
                await self._connect(resume=resume.value)
                self._announced = resume.value  # the control plane already holds this id
                await self._report_config_problems()
                return
            except ResumeFailed as exc:
                await self.ports.emit(
                    "diagnostic.reported",
                    {
                        "code": "provider.resume_failed",
                        "severity": "warning",
                        "message": str(exc),
                        "details": {"runtime": RUNTIME},
                    },
                )
        await self._connect(resume=None)
        await self._report_config_problems()
        if resume is not None:
            await self.ports.emit("runtime.session.reset", {"previous": resume.value, "current": self._session_id})
        if execution.recovery_messages:
            # Resume failed (or there was no native id to resume): replay the history as context once.
            self._recovery_pending = recovery_preamble(execution.recovery_messages)

    async def _connect(self, resume: str | None) -> None:
        session_id = resume or str(uuid.uuid4())
        launch = claude_setup.launch(self.config, self._host, Session(resume, None if resume else session_id))
        self._pending_diagnostics = launch.problems
        await self._cli.connect(
            launch,
            cwd=self.config.session.cwd,
            resume=resume,
            on_permission=self._can_use_tool,
            on_problem=self._protocol,
        )
        self._cost_total = 0.0  # a new CLI process counts its cost from zero
        self._session_id = session_id

    def stderr_tail(self) -> str:
        return self._cli.stderr_tail()

    async def stop(self) -> None:
        await self._cli.stop()
        host, self._host = self._host, None
        if host is not None:
            await host.close()

    def process_group_ids(self) -> list[int]:
        return self._cli.group_ids()

    async def wait_exited(self) -> None:
        await self._cli.wait_exited()

    async def reset(self) -> tuple[str | None, str | None]:
        previous = self._session_id
        await self._cli.stop()
        self._recovery_pending = ""
        self._announced = None
        await self._connect(resume=None)
        await self._report_config_problems()
        return previous, self._session_id

    async def _report_config_problems(self) -> None:
        problems, self._pending_diagnostics = self._pending_diagnostics, []
        for problem in problems:
            await self.ports.emit(
                "diagnostic.reported", {"code": "provider.config", "severity": "warning", "message": problem}
            )

    # -- turns -------------------------------------------------------------------------------------

    async def run(self, run_id: str, run_input: RunInput) -> TurnOutcome:
        client = self._cli.client
        if client is None or client.closed.is_set():
            raise ProviderError("provider.not_running", "the Claude Code CLI is not running", retryable=True)
        content = self._content(self._recovery_pending + run_input.text, run_input)
        self._cancelling = False
        translator = TurnTranslator(run_id, self._tools_started, self._refused, self.config.session.cwd)
        self._translator = translator
        prompt_uuid = str(uuid.uuid4())
        self._pending_prompts = [prompt_uuid]
        self._turn_over = False
        try:
            await client.send(user_message(content, prompt_uuid))
            self._recovery_pending = ""
            result = await self._drain(client, translator)
        except ProviderError:
            raise
        except Exception as exc:
            raise ProviderError(
                "provider.crashed",
                f"Claude Code stopped mid-turn: {self._redact(str(exc))}",
                retryable=True,
                details={"stderr_tail": self.stderr_tail()},
            ) from None
        finally:
            self._translator = None
            self._turn_over = True
            self._pending_prompts = []
        return await self._outcome(result, translator)

    async def steer(self, run_id: str, run_input: RunInput) -> None:
        """Streaming input (mode `native`): the steer is written to the live CLI as one more user
        message while the turn runs. Claude Code takes it into the running turn: the model gets it in
        the turn's next request (after the response or tool call under way), and the turn's result
        names it among the prompts it answered; `_drain` waits for every prompt of the turn."""
        client, translator = self._cli.client, self._translator
        if client is None or translator is None or translator.run_id != run_id or self._turn_over:
            raise SteerRefused("run.not_active", "no Claude turn is running for this run")
        if self._cancelling:
            raise SteerRefused("cancelled", "the run was cancelled before the input reached Claude Code")
        content = self._content(run_input.text, run_input)
        steer_uuid = str(uuid.uuid4())
        # Registered before the write (no await in between with the check above): the turn cannot be
        # declared over while this prompt is on its way.
        self._pending_prompts.append(steer_uuid)
        try:
            await client.send(user_message(content, steer_uuid))
        except Exception as exc:
            with contextlib.suppress(ValueError):
                self._pending_prompts.remove(steer_uuid)
            raise ProviderError(
                "provider.crashed", f"Claude Code did not take the input: {self._redact(str(exc))}", retryable=True
            ) from None

    def _content(self, text: str, run_input: RunInput) -> str | list[dict[str, Any]]:
        """The prompt, with image attachments as image blocks (other files are named in the text by
        the kernel, for the model to read with its tools)."""
        try:
            local = attachments.local(self._cwd, run_input.attachments)
            images = [
                {"type": "image", "source": {"type": "base64", "media_type": a.mime_type, "data": a.base64()}}
                for a in local
                if a.kind == "image"
            ]
        except (attachments.AttachmentRefused, OSError) as exc:
            raise ProviderError("command.invalid", str(exc)) from None
        return [{"type": "text", "text": text}, *images] if images else text

    async def _drain(self, client: ClaudeClient, translator: TurnTranslator) -> wire.ResultMessage:
        """Read messages until the results of every prompt of this turn (its own, and steers'); emit
        as they come. A steer the CLI took before a cancel is still the run's: the CLI answers it
        after the interrupted prompt, so it is interrupted in turn and its result awaited (at most
        STEER_ORPHAN_S; then the turn ends anyway), never left to leak into the next run."""
        last: wire.ResultMessage | None = None  # after a cancel: the latest result, while a steer's is still awaited
        with anyio.CancelScope() as scope:
            async for message in client.messages():
                if isinstance(message, wire.ResultMessage):
                    answered = prompts_answered(message, self._pending_prompts)
                    if not answered:
                        continue  # a late result of an earlier, interrupted turn must not end this one
                    self._pending_prompts = [p for p in self._pending_prompts if p not in answered]
                    if self._pending_prompts:
                        # One prompt's result; a steer's is still to come: the turn goes on.
                        await self._note_session(getattr(message, "session_id", None))
                        if self._cancelling:
                            last = message
                            scope.deadline = min(scope.deadline, anyio.current_time() + STEER_ORPHAN_S)
                            with anyio.move_on_after(INTERRUPT_TIMEOUT_S), contextlib.suppress(Exception):
                                await client.request(control.INTERRUPT)
                        continue
                    self._turn_over = True
                await self._note_session(getattr(message, "session_id", None) or init_session(message))
                translator.cancelling = self._cancelling
                for out in translator.translate(message):
                    if isinstance(out, FileTouched):
                        await self._file_touched(out)
                    else:
                        await self.ports.emit(*out)
                if isinstance(message, wire.ResultMessage):
                    for kind, payload in translator.close_open_items():
                        await self.ports.emit(kind, payload)
                    return message
        if last is not None:
            # Cancelled, and the CLI did not answer a steer it had taken within the bound.
            self._turn_over = True
            for kind, payload in translator.close_open_items():
                await self.ports.emit(kind, payload)
            return last
        raise ProviderError(
            "provider.crashed",
            "Claude Code ended its output before the turn finished",
            retryable=True,
            details={"stderr_tail": self.stderr_tail()},
        )

    async def _note_session(self, session_id: str | None) -> None:
        if not session_id or session_id == "default":
            return
        self._session_id = session_id
        if session_id != self._announced:
            self._announced = session_id
            await self.ports.emit("runtime.resume.updated", {"runtime": RUNTIME, "value": session_id})

    async def _outcome(self, result: wire.ResultMessage, translator: TurnTranslator) -> TurnOutcome:
        usage = usage_payload(result)
        total = usage["cost_usd"]
        if total is not None:
            usage["cost_usd"] = cost_share(total, self._cost_total)
            self._cost_total = total
        await self.ports.emit("usage.updated", usage)
        return turn_outcome(result, translator, usage, cancelling=self._cancelling, redact=self._redact)

    async def cancel(self) -> None:
        self._cancelling = True
        if self._translator is not None:
            self._translator.cancelling = True
        client = self._cli.client
        if client is None:
            return
        # No active turn, or the CLI is gone: either way the kernel escalates if run() does not end.
        with anyio.move_on_after(INTERRUPT_TIMEOUT_S), contextlib.suppress(Exception):
            await client.request(control.INTERRUPT)

    async def _file_touched(self, touched: FileTouched) -> None:
        """A file tool succeeded: report the file as `file.changed` if it is inside the allowed roots."""
        try:
            path = self.ports.files.admit(touched.path)
        except PathNotAllowed:
            return
        digest = await anyio.to_thread.run_sync(sha256_of, path)
        gone = digest is None and not os.path.lexists(path)  # None also for a file too large to hash
        change = "deleted" if gone else ("created" if touched.created else "modified")
        await self.ports.emit(
            "file.changed", {"path": relative_to_cwd(path, self._cwd), "change": change, "sha256": digest}
        )

    # -- permissions -------------------------------------------------------------------------------

    async def _can_use_tool(self, ask: control.PermissionAsk) -> control.PermissionAnswer:
        if not claude_permissions.asks(ask.tool_name):
            return control.PermissionAnswer(True, updated_input=ask.tool_input)
        tool_call_id = ask.tool_use_id or f"perm-{uuid.uuid4().hex[:12]}"
        # PROTOCOL §6.2: a permission request names its tool call, so the call has started by now.
        if self._translator is not None:
            parent = self._translator.parent_for_agent(ask.agent_id)
            for kind, payload in self._translator.tool_started(tool_call_id, ask.tool_name, ask.tool_input, parent):
                await self.ports.emit(kind, payload)
        detail = ask.description or ask.title or tool_title(ask.tool_name, ask.tool_input)
        request = claude_permissions.request_of(
            tool_call_id, ask.tool_name, ask.tool_input, display_name=ask.display_name, detail=detail
        )
        answer = claude_permissions.answer_of(await self.ports.permissions.request(request), ask.suggestions)
        if answer.refused is not None:
            self._refused[tool_call_id] = answer.refused
        if answer.allow:
            return control.PermissionAnswer(
                True, updated_input=ask.tool_input, updated_permissions=answer.updated_permissions
            )
        return control.PermissionAnswer(False, message=answer.message, interrupt=answer.interrupt)
