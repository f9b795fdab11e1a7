"""The Claude Agent SDK adapter: one `ClaudeSDKClient` (and so one Claude Code CLI) per session.

The SDK's own loop is kept: a prompt goes in with `query()`, and the messages that come back (raw
API stream events, whole assistant messages, tool results, the turn's result) are mapped onto our
events by `TurnTranslator`. Permission prompts arrive through `can_use_tool` on an SDK task of its
own and go through the permission port; the turn loop keeps draining messages meanwhile, because the
SDK buffers only 100 and would stall the CLI otherwise.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, ClassVar

import anyio
import claude_agent_sdk as sdk

from driver.adapters.base import (
    Adapter,
    AdapterConfig,
    PermissionOption,
    PermissionRequest,
    Ports,
    ProviderError,
    TurnOutcome,
)
from driver.adapters.claude_options import (
    RESERVED_OPTIONS,
    RUNTIME,
    bundled_cli,
    mcp_servers,
    mcp_stdio_environment,
    provider_environment,
    recovery_preamble,
    redactor,
    system_prompt,
    write_launcher,
)
from driver.adapters.registry import CAPABILITIES
from driver.protocol.commands import RunInput

STDERR_LINES = 200
STDERR_LINE_CHARS = 2000
INTERRUPT_TIMEOUT_S = 5.0
DISCONNECT_TIMEOUT_S = 10.0
HOST_TOOL_PREFIX = "mcp__host__"  # how the CLI names the tools of the in-process `host` MCP server

PERMISSION_OPTIONS: tuple[PermissionOption, ...] = (
    PermissionOption("allow_once", "allow_once", "Allow once"),
    PermissionOption("allow_always", "allow_always", "Allow for this session"),
    PermissionOption("reject_once", "reject_once", "Reject"),
)


class ResumeFailed(Exception):
    pass


# --------------------------------------------------------------------------------------------------
# Turn translation: SDK messages -> our events


@dataclasses.dataclass(slots=True)
class _Block:
    kind: str  # "text" | "thinking" | "tool_use"
    item_id: str
    text: str = ""


class TurnTranslator:
    """Maps the SDK messages of one turn onto event kinds and payloads.

    Text and thinking stream through `StreamEvent`s (started/delta, completed at content_block_stop,
    which carries everything the deltas did); a whole `AssistantMessage` only adds blocks the stream
    did not show. Tool calls start from the assistant's `ToolUseBlock` (or earlier, from the
    permission callback) and complete from the `ToolResultBlock` in the next user message.
    """

    def __init__(self, run_id: str, tools_started: set[str], refused: dict[str, str]) -> None:
        self.run_id = run_id
        self.tools_started = tools_started
        self.refused = refused  # tool call id -> "declined" | "cancelled", decided by the permission port
        self.final_message_id: str | None = None
        self.final_message_text = ""
        self.api_message_id: str | None = None
        self.streamed_messages: set[str] = set()
        self.blocks: dict[int, _Block] = {}
        self.open_tools: dict[str, None] = {}  # started in this turn, no result yet (ordered)
        self.error_texts: list[str] = []
        self.extra = 0
        self.cancelling = False

    def _next_id(self, suffix: str) -> str:
        self.extra += 1
        return f"{self.run_id}:{suffix}{self.extra}"

    def translate(self, message: Any) -> list[tuple[str, dict[str, Any]]]:
        if isinstance(message, sdk.StreamEvent):
            if message.parent_tool_use_id is not None:
                return []  # a subagent's inner stream: its tool call is reported as a whole
            return self._stream_event(message.event)
        if isinstance(message, sdk.AssistantMessage):
            return self._assistant(message)
        if isinstance(message, sdk.UserMessage):
            return self._tool_results(message)
        return []

    def _stream_event(self, event: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        kind = event.get("type")
        out: list[tuple[str, dict[str, Any]]] = []
        if kind == "message_start":
            msg = event.get("message") or {}
            self.api_message_id = str(msg.get("id") or self._next_id("api"))
            self.streamed_messages.add(self.api_message_id)
            self.blocks = {}
        elif kind == "content_block_start":
            index = int(event.get("index", 0))
            block = event.get("content_block") or {}
            base = f"{self.api_message_id or self.run_id}:{index}"
            if block.get("type") == "text":
                self.blocks[index] = _Block("text", base)
                out.append(("message.started", {"message_id": base, "role": "assistant"}))
            elif block.get("type") == "thinking":
                self.blocks[index] = _Block("thinking", base)
                out.append(("thought.started", {"thought_id": base, "text": ""}))
        elif kind == "content_block_delta":
            index = int(event.get("index", 0))
            delta = event.get("delta") or {}
            current = self.blocks.get(index)
            if current is None:
                return out
            if delta.get("type") == "text_delta" and current.kind == "text":
                piece = str(delta.get("text", ""))
                current.text += piece
                out.append(("message.delta", {"message_id": current.item_id, "text": piece}))
            elif delta.get("type") == "thinking_delta" and current.kind == "thinking":
                piece = str(delta.get("thinking", ""))
                current.text += piece
                out.append(("thought.delta", {"thought_id": current.item_id, "text": piece}))
        elif kind == "content_block_stop":
            current = self.blocks.pop(int(event.get("index", 0)), None)
            if current is not None and current.kind == "text":
                out.append(
                    ("message.completed", {"message_id": current.item_id, "role": "assistant", "text": current.text})
                )
                self.final_message_id, self.final_message_text = current.item_id, current.text
            elif current is not None and current.kind == "thinking":
                out.append(("thought.completed", {"thought_id": current.item_id, "text": current.text}))
        return out

    def close_open_items(self) -> list[tuple[str, dict[str, Any]]]:
        """At the turn's end, complete what an interrupt cut off, so every started item (message,
        thought, tool call) has its completed."""
        out: list[tuple[str, dict[str, Any]]] = []
        for tool_call_id in self.open_tools:
            status = self.refused.get(tool_call_id) or ("cancelled" if self.cancelling else "failed")
            payload = {"tool_call_id": tool_call_id, "status": status, "output": None, "exit_code": None}
            out.append(("tool.completed", payload))
        self.open_tools = {}
        for index in sorted(self.blocks):
            current = self.blocks[index]
            if current.kind == "text":
                out.append(
                    ("message.completed", {"message_id": current.item_id, "role": "assistant", "text": current.text})
                )
            else:
                out.append(("thought.completed", {"thought_id": current.item_id, "text": current.text}))
        self.blocks = {}
        return out

    def _assistant(self, message: Any) -> list[tuple[str, dict[str, Any]]]:
        if message.parent_tool_use_id is not None:
            return []
        out: list[tuple[str, dict[str, Any]]] = []
        if message.error is not None:
            # A synthetic message the CLI writes for a failed API call: an error, not an answer.
            self.error_texts.extend(b.text for b in message.content if isinstance(b, sdk.TextBlock))
            return out
        streamed = message.message_id is not None and message.message_id in self.streamed_messages
        for block in message.content:
            if isinstance(block, sdk.ToolUseBlock):
                out.extend(self.tool_started(block.id, block.name, block.input))
            elif isinstance(block, sdk.TextBlock) and not streamed:
                item = self._next_id("m")
                out.append(("message.started", {"message_id": item, "role": "assistant"}))
                out.append(("message.completed", {"message_id": item, "role": "assistant", "text": block.text}))
                self.final_message_id, self.final_message_text = item, block.text
            elif isinstance(block, sdk.ThinkingBlock) and not streamed:
                item = self._next_id("t")
                out.append(("thought.started", {"thought_id": item, "text": ""}))
                out.append(("thought.completed", {"thought_id": item, "text": block.thinking}))
        return out

    def tool_started(self, tool_call_id: str, name: str, tool_input: Any) -> list[tuple[str, dict[str, Any]]]:
        if tool_call_id in self.tools_started:
            return []
        self.tools_started.add(tool_call_id)
        self.open_tools[tool_call_id] = None
        payload = {
            "tool_call_id": tool_call_id,
            "name": name,
            "title": tool_title(name, tool_input),
            "input": tool_input,
        }
        return [("tool.started", payload)]

    def _tool_results(self, message: Any) -> list[tuple[str, dict[str, Any]]]:
        if message.parent_tool_use_id is not None or not isinstance(message.content, list):
            return []
        out: list[tuple[str, dict[str, Any]]] = []
        for block in message.content:
            if not isinstance(block, sdk.ToolResultBlock):
                continue
            self.open_tools.pop(block.tool_use_id, None)
            if block.tool_use_id in self.refused:
                status = self.refused[block.tool_use_id]
            elif block.is_error:
                status = "cancelled" if self.cancelling else "failed"
            else:
                status = "completed"
            out.append(
                (
                    "tool.completed",
                    {"tool_call_id": block.tool_use_id, "status": status, "output": block.content, "exit_code": None},
                )
            )
        return out


def tool_title(name: str, tool_input: Any) -> str:
    """A short human line for a tool call: what it runs or which file it touches."""
    if isinstance(tool_input, dict):
        for key in ("description", "command", "file_path", "path", "pattern", "url"):
            value = tool_input.get(key)
            if isinstance(value, str) and value:
                return f"{name}: {value[:200]}"
    return name


def usage_payload(result: Any) -> dict[str, Any]:
    usage = result.usage or {}
    details = usage.get("output_tokens_details") or {}

    def _int(value: Any) -> int | None:
        return int(value) if isinstance(value, int | float) else None

    cost = result.total_cost_usd
    return {
        "input_tokens": _int(usage.get("input_tokens")),
        "output_tokens": _int(usage.get("output_tokens")),
        "cached_input_tokens": _int(usage.get("cache_read_input_tokens")),
        "reasoning_tokens": _int(details.get("thinking_tokens")),
        "cost_usd": float(cost) if isinstance(cost, int | float) else None,
    }


# --------------------------------------------------------------------------------------------------
# The adapter


class ClaudeAdapter(Adapter):
    runtime: ClassVar[str] = RUNTIME
    # file_change is not declared: the SDK reports tool calls, not file changes.
    # Declared once, in the registry, so `hello` can state them without importing this module.
    capabilities: ClassVar[frozenset[str]] = CAPABILITIES["claude-agent-sdk"]

    def __init__(self, config: AdapterConfig, ports: Ports) -> None:
        super().__init__(config, ports)
        self._client: Any = None
        self._session_id: str | None = None  # the native session id the CLI runs
        self._announced: str | None = None  # the last id sent in runtime.resume.updated
        self._recovery_pending = ""
        self._stderr: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)
        self._redact: Callable[[str], str] = redactor(config.execution.environment.values())
        self._translator: TurnTranslator | None = None
        self._tools_started: set[str] = set()
        self._refused: dict[str, str] = {}
        self._cancelling = False
        self._launcher_used = False
        self._pending_diagnostics: list[str] = []
        self.connect_seconds: float | None = None  # measured, for driver.started timings

    # -- lifecycle ---------------------------------------------------------------------------------

    @property
    def native_id(self) -> str | None:
        return self._session_id

    async def start(self) -> None:
        execution = self.config.execution
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
        options = self._options(resume=resume, session_id=None if resume else session_id)
        client = sdk.ClaudeSDKClient(options)
        started = time.monotonic()
        try:
            await client.connect()
        except Exception as exc:
            with anyio.CancelScope(shield=True):
                await self._disconnect(client)
            message = self._redact(str(exc))
            if resume is not None:
                raise ResumeFailed(f"could not resume Claude session {resume}: {message}") from None
            raise ProviderError(
                "provider.start_failed",
                f"Claude Code did not start: {message}",
                retryable=True,
                details={"stderr_tail": self.stderr_tail()},
            ) from None
        self.connect_seconds = time.monotonic() - started
        self._client = client
        self._session_id = session_id

    def _options(self, *, resume: str | None, session_id: str | None) -> Any:
        config = self.config
        execution = config.execution
        env = provider_environment(config.env, config.state_dir)
        env.update(mcp_stdio_environment(execution.mcp_servers))
        servers, problems = mcp_servers(execution.mcp_servers, execution.environment)
        self._pending_diagnostics = problems
        kwargs: dict[str, Any] = {
            "cwd": config.session.cwd,
            "system_prompt": system_prompt(execution),
            "include_partial_messages": True,
            "setting_sources": [],
            "env": env,
            "stderr": self._on_stderr,
            "mcp_servers": servers,
            "add_dirs": [d for d in [config.session.memory_dir, *config.session.additional_directories] if d],
        }
        if execution.model:
            kwargs["model"] = execution.model
        if execution.permission_policy == "full_access":
            kwargs["permission_mode"] = "bypassPermissions"
        else:
            kwargs["permission_mode"] = "default"
            kwargs["can_use_tool"] = self._can_use_tool
        host = self._host_server()
        if host is not None:
            kwargs["mcp_servers"] = {**servers, "host": host}
        if resume is not None:
            kwargs["resume"] = resume
        if session_id is not None:
            kwargs["session_id"] = session_id
        fields = {f.name for f in dataclasses.fields(sdk.ClaudeAgentOptions)}
        for key, value in execution.provider_options.items():
            if key in fields and key not in RESERVED_OPTIONS:
                kwargs[key] = value
            else:
                self._pending_diagnostics.append(f"provider_options.{key} is not a usable ClaudeAgentOptions field")
        cli = kwargs.pop("cli_path", None) or bundled_cli()  # provider_options may name another CLI
        launcher = write_launcher(config.state_dir, cli, env.keys(), os.environ) if cli else None
        self._launcher_used = launcher is not None
        if launcher is not None:
            kwargs["cli_path"] = str(launcher)
        elif cli is not None:
            kwargs["cli_path"] = str(cli)
        return sdk.ClaudeAgentOptions(**kwargs)

    def _host_server(self) -> Any:
        """PROTOCOL §6.3: the execution's host tools as one in-process MCP server named `host`; each
        call goes through the host-tool port (which reports `host_tool.called` and awaits the CP)."""
        tools = self.config.execution.host_tools
        if not tools:
            return None
        port = self.ports.host_tools

        def handler(name: str) -> Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]:
            async def call(arguments: dict[str, Any]) -> dict[str, Any]:
                reply = await port.call(name, arguments)
                return {"content": reply.content, "is_error": reply.is_error}

            return call

        definitions = [
            sdk.SdkMcpTool(name=t.name, description=t.description, input_schema=t.input_schema, handler=handler(t.name))
            for t in tools
        ]
        return sdk.create_sdk_mcp_server("host", tools=definitions)

    def _on_stderr(self, line: str) -> None:
        self._stderr.append(line[:STDERR_LINE_CHARS])

    def stderr_tail(self) -> str:
        return self._redact("\n".join(self._stderr))

    async def stop(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await self._disconnect(client)

    async def _disconnect(self, client: Any) -> None:
        pgid = self._pgid(client)
        # Shielded: stop() is often reached while being cancelled. A dead CLI must not make it raise.
        with (
            anyio.CancelScope(shield=True),
            anyio.move_on_after(DISCONNECT_TIMEOUT_S),
            contextlib.suppress(Exception),
        ):
            await client.disconnect()
        if pgid is not None:
            # Whatever the CLI left behind in its group (shell tools, MCP servers) goes with it.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)

    def _pgid(self, client: Any) -> int | None:
        if not self._launcher_used:
            return None  # without the launcher the CLI shares the driver's own group
        process = getattr(getattr(client, "_transport", None), "_process", None)
        pid = getattr(process, "pid", None)
        if not isinstance(pid, int) or getattr(process, "returncode", None) is not None:
            return None
        try:
            pgid = os.getpgid(pid)
        except ProcessLookupError:
            return None
        return pgid if pgid == pid and pgid != os.getpgrp() else None

    def process_group_ids(self) -> list[int]:
        pgid = self._pgid(self._client) if self._client is not None else None
        return [pgid] if pgid is not None else []

    async def wait_exited(self) -> None:
        # The CLI is the SDK transport's child process. Watch whichever client is current: stop() and
        # reset() drop `_client` before disconnecting, so an exit we caused is never reported.
        while True:
            client = self._client
            process = getattr(getattr(client, "_transport", None), "_process", None)
            if process is None:
                await anyio.sleep(0.5)  # not connected (stopped, or between reset's stop and connect)
                continue
            await process.wait()
            if self._client is client:
                return

    async def reset(self) -> tuple[str | None, str | None]:
        previous = self._session_id
        await self.stop()
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
        client = self._client
        if client is None:
            raise ProviderError("provider.not_running", "the Claude Code CLI is not running", retryable=True)
        self._cancelling = False
        translator = TurnTranslator(run_id, self._tools_started, self._refused)
        self._translator = translator
        prompt_uuid = str(uuid.uuid4())
        try:
            await client.query(_one(_user_message(self._recovery_pending + run_input.text, prompt_uuid)))
            self._recovery_pending = ""
            result = await self._drain(client, translator, prompt_uuid)
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
        return await self._outcome(result, translator)

    async def _drain(self, client: Any, translator: TurnTranslator, prompt_uuid: str) -> Any:
        """Read messages until this turn's result; emit as they come."""
        async for message in client.receive_messages():
            if isinstance(message, sdk.ResultMessage) and _answers_other_prompt(message, prompt_uuid):
                continue  # a late result of an earlier, interrupted turn must not end this one
            await self._note_session(getattr(message, "session_id", None) or _init_session(message))
            translator.cancelling = self._cancelling
            for kind, payload in translator.translate(message):
                await self.ports.emit(kind, payload)
            if isinstance(message, sdk.ResultMessage):
                for kind, payload in translator.close_open_items():
                    await self.ports.emit(kind, payload)
                return message
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

    async def _outcome(self, result: Any, translator: TurnTranslator) -> TurnOutcome:
        usage = usage_payload(result)
        await self.ports.emit("usage.updated", usage)
        common: dict[str, Any] = {
            "final_message_id": translator.final_message_id,
            "final_message_text": translator.final_message_text,
            "usage": usage,
        }
        aborted = str(result.terminal_reason or "").startswith("aborted")
        if self._cancelling or aborted:
            return TurnOutcome(status="cancelled", stop_reason="cancelled", **common)
        if result.is_error:
            text = "; ".join(result.errors or []) or (result.result or "").strip()
            text = text or "; ".join(translator.error_texts) or result.subtype
            status = result.api_error_status
            return TurnOutcome(
                status="failed",
                stop_reason="error",
                error_code="provider.model_error" if status else "provider.error",
                error_message=self._redact(text),
                error_retryable=bool(status) and (status >= 500 or status == 429),
                error_details={"subtype": result.subtype, "api_error_status": status},
                **common,
            )
        return TurnOutcome(status="completed", stop_reason=result.stop_reason or "end_turn", **common)

    async def cancel(self) -> None:
        self._cancelling = True
        if self._translator is not None:
            self._translator.cancelling = True
        client = self._client
        if client is None:
            return
        # No active turn, or the CLI is gone: either way the kernel escalates if run() does not end.
        with anyio.move_on_after(INTERRUPT_TIMEOUT_S), contextlib.suppress(Exception):
            await client.interrupt()

    # -- permissions -------------------------------------------------------------------------------

    async def _can_use_tool(self, tool_name: str, tool_input: dict[str, Any], context: Any) -> Any:
        if tool_name.startswith(HOST_TOOL_PREFIX):
            # Host tools run in the control plane, which decides about them itself: no local prompt.
            return sdk.PermissionResultAllow(updated_input=tool_input)
        tool_call_id = context.tool_use_id or f"perm-{uuid.uuid4().hex[:12]}"
        # PROTOCOL §6.2: a permission request names its tool call, so the call has started by now.
        if self._translator is not None:
            for kind, payload in self._translator.tool_started(tool_call_id, tool_name, tool_input):
                await self.ports.emit(kind, payload)
        label = context.display_name or tool_name
        detail = context.description or context.title or tool_title(tool_name, tool_input)
        request = PermissionRequest(
            tool_call_id=tool_call_id,
            title=f"{label}: {detail}" if detail and detail != label else label,
            options=PERMISSION_OPTIONS,
            tool_name=tool_name,
            tool_input=tool_input,
        )
        decision = await self.ports.permissions.request(request)
        if decision.allowed:
            updates = list(context.suggestions or []) if decision.option_kind == "allow_always" else None
            return sdk.PermissionResultAllow(updated_input=tool_input, updated_permissions=updates or None)
        if decision.outcome == "cancelled":
            self._refused[tool_call_id] = "cancelled"
            return sdk.PermissionResultDeny(message="The tool call was cancelled.", interrupt=True)
        self._refused[tool_call_id] = "declined"
        if decision.outcome == "timed_out":
            return sdk.PermissionResultDeny(message="No decision was made in time; the tool call was not run.")
        return sdk.PermissionResultDeny(message="The user declined this tool call.")


def _user_message(text: str, prompt_uuid: str) -> dict[str, Any]:
    # Our own uuid on the prompt comes back as the result's `user_message_uuid`: that is how a turn
    # knows its own result.
    return {
        "type": "user",
        "message": {"role": "user", "content": text},
        "parent_tool_use_id": None,
        "session_id": "default",
        "uuid": prompt_uuid,
    }


async def _one(message: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    yield message


def _answers_other_prompt(result: Any, prompt_uuid: str) -> bool:
    taken = [result.user_message_uuid, *(result.user_message_uuids or [])]
    known = [u for u in taken if u]
    return bool(known) and prompt_uuid not in known


def _init_session(message: Any) -> str | None:
    if isinstance(message, sdk.SystemMessage):
        value = message.data.get("session_id")
        return value if isinstance(value, str) else None
    return None
