"""One ACP prompt turn as a pure state machine: `session/update` payloads in, our events out.

No I/O here: `AcpTurn.feed(update)` returns the `(kind, payload)` events to emit, in order, and
`finish(stop_reason)` closes whatever is still open. The adapter does the emitting. Keeping it pure
lets the mapping be tested without an agent, and keeps the rules in one place:

- Text arrives as chunks. The first chunk of a message yields `message.started`, every chunk a
  best-effort `message.delta`, and the message is closed with a lossless `message.completed`
  carrying the whole text when the turn ends, when a chunk of the other stream (thought vs message)
  or with a different `messageId` arrives, or when a tool or plan update arrives. Usage and
  housekeeping updates (modes, commands, session info) do not split a message.
- A tool call's `content` is replaced, not appended, by each update, so it is never identity; the
  id is `toolCallId`. Output deltas are the new suffix of its text content when the new text
  extends the old, else the whole new text.
- `tool.started` waits until the tool call leaves `pending` (its input may still be streaming) or a
  permission request names it; it carries the latest title and input. Every tool call ends with
  exactly one `tool.completed` (preceded by its `tool.started`); one still open when the turn ends
  is closed `cancelled` (cancelled turn) or `failed` (otherwise), so no tool dangles.
- A completed tool whose content carried `diff`s yields one FILE_TOUCHED marker per file, for the
  adapter to report as `file.changed` (agents edit files natively, not only through `fs/*`).
- Unknown `sessionUpdate` variants are counted, never fatal.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import msgspec

from driver.adapters.acp import models as m

Emit = tuple[str, dict[str, Any]]

# Variants we understand but that carry nothing for our event vocabulary.
IGNORED_UPDATES: frozenset[str] = frozenset(
    {
        "user_message_chunk",
        "available_commands_update",
        "current_mode_update",
        "config_option_update",
        "session_info_update",
        "notice",
        "compaction_update",
        "compaction_summary_chunk",
    }
)

TOOL_TERMINAL = {"completed": "completed", "failed": "failed"}

# Not an event kind: "this file was changed by a tool that completed" ({path, created}). The adapter
# turns it into `file.changed` after admitting the path and hashing the file (I/O stays out of here).
FILE_TOUCHED = "acp.file_touched"


@dataclass
class _Stream:
    kind: str  # "message" | "thought"
    id: str
    agent_message_id: str | None
    parts: list[str] = field(default_factory=list)


@dataclass
class _Tool:
    id: str
    name: str = "other"
    title: str = ""
    input: Any = None
    status: str | None = None
    text: str = ""
    announced: bool = False
    done: bool = False
    # Files the tool's `diff` content says it changes: path → created (no old text).
    diffs: dict[str, bool] = field(default_factory=dict)


class AcpTurn:
    def __init__(self, run_id: str, cost_before: float = 0.0) -> None:
        self.run_id = run_id
        # ACP's `usage_update.cost` is the session's cumulative cost; a run reports its own share.
        self._cost_before = cost_before
        self.cost_total = cost_before
        self._seq = 0
        self._open: _Stream | None = None
        self._tools: dict[str, _Tool] = {}
        self.final_message_id: str | None = None
        self.final_message_text = ""
        self.unknown_updates: Counter[str] = Counter()
        self.malformed_updates = 0
        self.usage: dict[str, Any] | None = None
        self.declined = False  # a permission of this turn was rejected
        # Terminals (ours, from terminal/create) a tool call embeds: terminal id -> tool call id. Their
        # output is the tool's output; the adapter streams it as tool.output.delta.
        self.terminals: dict[str, str] = {}
        self.new_terminals: list[str] = []  # linked since the adapter last looked
        # Set once a cancel was asked: a tool the agent then reports `failed` was stopped by it.
        self.cancelling = False

    # ---- ids --------------------------------------------------------------------------------

    def _new_id(self, prefix: str) -> str:
        # Unique within the session: run ids are unique, and the counter is per turn.
        self._seq += 1
        return f"{self.run_id}-{prefix}{self._seq}"

    # ---- public -----------------------------------------------------------------------------

    def feed(self, update: dict[str, Any]) -> list[Emit]:
        variant = update.get("sessionUpdate")
        try:
            if variant == "agent_message_chunk":
                return self._chunk("message", m.decode(update, m.ContentChunk))
            if variant == "agent_thought_chunk":
                return self._chunk("thought", m.decode(update, m.ContentChunk))
            if variant in ("tool_call", "tool_call_update"):
                return self._tool_update(m.decode(update, m.ToolCall))
            if variant == "plan":
                plan = m.decode(update, m.Plan)
                out = self._close()
                entries = [{"content": e.content, "status": e.status} for e in plan.entries]
                out.append(("plan.updated", {"entries": entries}))
                return out
            if variant == "usage_update":
                return self._usage_update(m.decode(update, m.UsageUpdate))
        except msgspec.ValidationError:
            self.malformed_updates += 1
            return []
        if variant not in IGNORED_UPDATES:
            self.unknown_updates[str(variant)] += 1
        return []

    def announce_tool(self, call: m.ToolCall) -> list[Emit]:
        """A permission request names a tool call (with its full input): announce it now, even if the
        agent never did (some ask first)."""
        out = self._close()
        out.extend(self._announce(self._merge(call)))
        return out

    def decline_tool(self, tool_call_id: str) -> list[Emit]:
        """The user rejected the tool's permission: it ends `declined` (PROTOCOL §6.2)."""
        self.declined = True
        return self._complete_tool(tool_call_id, "declined", None)

    def finish(self, stop_reason: str) -> list[Emit]:
        out = self._close()
        end_status = "cancelled" if stop_reason == "cancelled" else "failed"
        for tool in list(self._tools.values()):
            if not tool.done:
                out.extend(self._complete_tool(tool.id, end_status, None))
        return out

    def prompt_usage(self, usage: m.PromptUsage) -> list[Emit]:
        payload = {
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
            "cached_input_tokens": usage.cached_read_tokens,
            "reasoning_tokens": usage.thought_tokens,
            "cost_usd": (self.usage or {}).get("cost_usd"),
        }
        self.usage = payload
        return [("usage.updated", payload)]

    @property
    def started_tool_ids(self) -> list[str]:
        return [t.id for t in self._tools.values() if t.announced]

    # ---- text -------------------------------------------------------------------------------

    def _chunk(self, kind: str, chunk: m.ContentChunk) -> list[Emit]:
        text = chunk.content.text if chunk.content.type == "text" else None
        if not text:
            return []
        out: list[Emit] = []
        cur = self._open
        if cur is not None and (
            cur.kind != kind or (chunk.message_id is not None and chunk.message_id != cur.agent_message_id)
        ):
            out.extend(self._close())
            cur = None
        if cur is None:
            cur = _Stream(kind, self._new_id("msg-" if kind == "message" else "thought-"), chunk.message_id)
            self._open = cur
            if kind == "message":
                out.append(("message.started", {"message_id": cur.id, "role": "assistant"}))
            else:
                out.append(("thought.started", {"thought_id": cur.id, "text": ""}))
        cur.parts.append(text)
        if kind == "message":
            out.append(("message.delta", {"message_id": cur.id, "text": text}))
        else:
            out.append(("thought.delta", {"thought_id": cur.id, "text": text}))
        return out

    def _close(self) -> list[Emit]:
        cur, self._open = self._open, None
        if cur is None:
            return []
        text = "".join(cur.parts)
        if cur.kind == "thought":
            return [("thought.completed", {"thought_id": cur.id, "text": text})]
        self.final_message_id, self.final_message_text = cur.id, text
        return [("message.completed", {"message_id": cur.id, "role": "assistant", "text": text})]

    # ---- tools ------------------------------------------------------------------------------

    def _merge(self, call: m.ToolCall) -> _Tool:
        """Fold what this update says about the tool into what we know (updates are partial)."""
        tool = self._tools.get(call.tool_call_id)
        if tool is None:
            tool = self._tools[call.tool_call_id] = _Tool(call.tool_call_id)
        if call.title:
            tool.title = call.title
        if call.name or call.kind:
            tool.name = call.name or tool.name or call.kind or "other"
        if call.raw_input is not None and call.raw_input != {}:
            tool.input = call.raw_input
        if call.status is not None:
            tool.status = call.status
        return tool

    def _announce(self, tool: _Tool) -> list[Emit]:
        if tool.announced:
            return []
        tool.announced = True
        payload = {"tool_call_id": tool.id, "name": tool.name, "title": tool.title, "input": tool.input}
        return [("tool.started", payload)]

    def _tool_update(self, call: m.ToolCall) -> list[Emit]:
        out = self._close()
        tool = self._merge(call)
        if tool.done:
            return out
        # A `pending` tool call may still be streaming its input (claude-agent-acp sends an empty
        # rawInput first, then fills it in): announce it once it runs, is decided, or asks.
        if tool.status != "pending":
            out.extend(self._announce(tool))
        for item in call.content or []:
            if item.type == "diff" and item.path:
                tool.diffs.setdefault(item.path, item.old_text is None)
            elif item.type == "terminal" and item.terminal_id and item.terminal_id not in self.terminals:
                self.terminals[item.terminal_id] = tool.id
                self.new_terminals.append(item.terminal_id)
        text = _content_text(call.content)
        if text is not None and text != tool.text:
            delta = text[len(tool.text) :] if text.startswith(tool.text) else text
            tool.text = text
            # Only a running tool's text is output; a pending one's is a description of it.
            if delta and tool.status == "in_progress":
                out.append(("tool.output.delta", {"tool_call_id": tool.id, "text": delta}))
        if tool.status in TOOL_TERMINAL:
            output = call.raw_output if call.raw_output is not None else (tool.text or None)
            status = TOOL_TERMINAL[tool.status]
            if status == "failed" and self.cancelling:
                status = "cancelled"
            out.extend(self._complete_tool(tool.id, status, output))
        return out

    def _complete_tool(self, tool_call_id: str, status: str, output: Any) -> list[Emit]:
        tool = self._tools.get(tool_call_id)
        if tool is None or tool.done:
            return []
        out = self._announce(tool)
        tool.done = True
        payload = {"tool_call_id": tool_call_id, "status": status, "output": output, "exit_code": _exit_code(output)}
        out.append(("tool.completed", payload))
        if status == "completed":
            out.extend((FILE_TOUCHED, {"path": path, "created": created}) for path, created in tool.diffs.items())
        return out

    # ---- usage ------------------------------------------------------------------------------

    def _usage_update(self, usage: m.UsageUpdate) -> list[Emit]:
        if usage.cost is None or usage.cost.currency.upper() != "USD":
            return []
        total = usage.cost.amount
        before = self._cost_before
        # A total below the session's earlier one: the agent started counting again (a new process).
        run_cost = round(total - before if total >= before else total, 9)
        self.cost_total = total
        self.usage = {**(self.usage or {}), "cost_usd": run_cost}
        return [("usage.updated", {"cost_usd": run_cost})]


def _content_text(content: list[m.ToolCallContent] | None) -> str | None:
    if content is None:
        return None
    texts = [c.content.text for c in content if c.type == "content" and c.content and c.content.text]
    return "".join(texts) if texts else None


def _exit_code(output: Any) -> int | None:
    # Agents put a shell's exit code in rawOutput under different names; take it only when it is an int.
    if isinstance(output, dict):
        for key in ("exit_code", "exitCode"):
            value = output.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    return None
