"""One Claude turn: the CLI's messages (claude_messages.py) -> our events (no I/O but a file-existence check).

Text and thinking stream through `StreamEvent`s (started/delta, completed at content_block_stop,
which carries everything the deltas did); a whole `AssistantMessage` only adds blocks the stream
did not show. Tool calls start from the assistant's `ToolUseBlock` (or earlier, from the
permission callback) and complete from the `ToolResultBlock` in the next user message.

A subagent's work (messages carrying `parent_tool_use_id`, the delegating Task/Agent call) is reported
as tool events of its own tools with `parent_tool_call_id` set, and its words as output deltas of the
delegating call. File-writing tools (Write, Edit, MultiEdit, NotebookEdit) that succeed yield
`FileTouched` for the adapter to hash and report as `file.changed`.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from driver.adapters.claude import messages as wire

Emit = tuple[str, dict[str, Any]]

# Claude Code's file-writing tools and the input field naming the file.
FILE_TOOLS: dict[str, str] = {
    "Write": "file_path",
    "Edit": "file_path",
    "MultiEdit": "file_path",
    "NotebookEdit": "notebook_path",
}
# Tools that run a subagent (Claude Code renamed Task to Agent).
DELEGATING_TOOLS: frozenset[str] = frozenset({"Task", "Agent"})


@dataclasses.dataclass(frozen=True, slots=True)
class FileTouched:
    """A file a completed tool wrote: `path` absolute; `created` when it did not exist before."""

    path: str
    created: bool


@dataclasses.dataclass(slots=True)
class _Block:
    kind: str  # "text" | "thinking" | "tool_use"
    item_id: str
    text: str = ""


class TurnTranslator:
    """Maps the CLI messages of one turn onto event kinds and payloads (see the module doc)."""

    def __init__(self, run_id: str, tools_started: set[str], refused: dict[str, str], cwd: str = ".") -> None:
        self.run_id = run_id
        self.cwd = cwd
        self.file_tools: dict[str, FileTouched] = {}  # tool call id -> the file it writes
        self.delegations: dict[str, None] = {}  # open Task/Agent calls (ordered)
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

    def translate(self, message: Any) -> list[Emit | FileTouched]:
        if isinstance(message, wire.StreamEvent):
            if message.parent_tool_use_id is not None:
                return []  # a subagent's inner stream: its whole messages are reported below
            return list(self._stream_event(message.event))
        if isinstance(message, wire.AssistantMessage):
            return list(self._assistant(message))
        if isinstance(message, wire.UserMessage):
            return self._tool_results(message)
        return []

    def _stream_event(self, event: dict[str, Any]) -> list[Emit]:
        kind = event.get("type")
        out: list[Emit] = []
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

    def close_open_items(self) -> list[Emit]:
        """At the turn's end, complete what an interrupt cut off, so every started item (message,
        thought, tool call) has its completed."""
        out: list[Emit] = []
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

    def _assistant(self, message: Any) -> list[Emit]:
        parent = message.parent_tool_use_id
        if parent is not None:
            return self._subagent(message, parent)
        out: list[Emit] = []
        if message.error is not None:
            # A synthetic message the CLI writes for a failed API call: an error, not an answer.
            self.error_texts.extend(b.text for b in message.content if isinstance(b, wire.TextBlock))
            return out
        streamed = message.message_id is not None and message.message_id in self.streamed_messages
        for block in message.content:
            if isinstance(block, wire.ToolUseBlock):
                out.extend(self.tool_started(block.id, block.name, block.input))
            elif isinstance(block, wire.TextBlock) and not streamed:
                item = self._next_id("m")
                out.append(("message.started", {"message_id": item, "role": "assistant"}))
                out.append(("message.completed", {"message_id": item, "role": "assistant", "text": block.text}))
                self.final_message_id, self.final_message_text = item, block.text
            elif isinstance(block, wire.ThinkingBlock) and not streamed:
                item = self._next_id("t")
                out.append(("thought.started", {"thought_id": item, "text": ""}))
                out.append(("thought.completed", {"thought_id": item, "text": block.thinking}))
        return out

    def _subagent(self, message: Any, parent: str) -> list[Emit]:
        """A subagent's whole message: its tool calls under the delegating call, its words as that
        call's output."""
        out: list[Emit] = []
        if message.error is not None:
            return out
        for block in message.content:
            if isinstance(block, wire.ToolUseBlock):
                out.extend(self.tool_started(block.id, block.name, block.input, parent=parent))
            elif isinstance(block, wire.TextBlock) and block.text:
                out.append(("tool.output.delta", {"tool_call_id": parent, "text": block.text}))
        return out

    def parent_for_agent(self, agent_id: str | None) -> str | None:
        """The delegating call a subagent's permission request belongs to: the permission callback
        names the subagent, not the call; the latest open Task/Agent call is the one running."""
        if agent_id is None or not self.delegations:
            return None
        return next(reversed(self.delegations))

    def tool_started(self, tool_call_id: str, name: str, tool_input: Any, parent: str | None = None) -> list[Emit]:
        if tool_call_id in self.tools_started:
            return []
        self.tools_started.add(tool_call_id)
        self.open_tools[tool_call_id] = None
        if name in DELEGATING_TOOLS:
            self.delegations[tool_call_id] = None
        field = FILE_TOOLS.get(name)
        target = tool_input.get(field) if field and isinstance(tool_input, dict) else None
        if isinstance(target, str) and target:
            path = os.path.normpath(os.path.join(self.cwd, target))
            # Whether it existed is noted now, before the tool runs (on its request or announcement).
            self.file_tools[tool_call_id] = FileTouched(path, created=not os.path.exists(path))
        payload = {
            "tool_call_id": tool_call_id,
            "name": name,
            "title": tool_title(name, tool_input),
            "input": tool_input,
            "parent_tool_call_id": parent,
        }
        return [("tool.started", payload)]

    def _tool_results(self, message: Any) -> list[Emit | FileTouched]:
        if not isinstance(message.content, list):
            return []
        out: list[Emit | FileTouched] = []
        for block in message.content:
            if not isinstance(block, wire.ToolResultBlock):
                continue
            if block.tool_use_id not in self.open_tools and message.parent_tool_use_id is not None:
                continue  # a subagent's result for a call we never saw started
            self.open_tools.pop(block.tool_use_id, None)
            self.delegations.pop(block.tool_use_id, None)
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
            touched = self.file_tools.pop(block.tool_use_id, None)
            if touched is not None and status == "completed":
                out.append(touched)
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


# -- the prompt and the messages around a turn ------------------------------------------------------


def user_message(content: str | list[dict[str, Any]], prompt_uuid: str) -> dict[str, Any]:
    # Our own uuid on the prompt comes back as the result's `user_message_uuid`: that is how a turn
    # knows its own result.
    return {
        "type": "user",
        "message": {"role": "user", "content": content},
        "parent_tool_use_id": None,
        "session_id": "default",
        "uuid": prompt_uuid,
    }


def prompts_answered(result: Any, pending: list[str]) -> list[str]:
    """Which of the turn's `pending` prompts a result answers. A result naming no prompt (a CLI that
    does not say) answers the oldest one; one naming only others answers none (a late result)."""
    taken = [result.user_message_uuid, *(result.user_message_uuids or [])]
    known = {u for u in taken if u}
    if not known:
        return pending[:1]
    return [p for p in pending if p in known]


def init_session(message: Any) -> str | None:
    if isinstance(message, wire.SystemMessage):
        value = message.data.get("session_id")
        return value if isinstance(value, str) else None
    return None
