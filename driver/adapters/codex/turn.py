"""One Codex turn: app-server notifications -> our events (no I/O).

`CodexTurn.handle(method, params)` returns what to emit. Items are identified by Codex's own item ids
(unique within a thread; a resumed thread keeps them unique too), so our message/thought/tool ids are
the provider's. The final message comes from `item/completed` notifications, never from the item list
of `turn/completed`, which Codex does not reliably fill.

File changes need the new content's hash, which is I/O: they are returned as `FileTouched` values for
the adapter to hash and emit as `file.changed`. A path Codex names is the agent's word: it is admitted
first (`admit`, the files port's, whose resolve is the only filesystem access here), and one outside the
allowed roots (or in the driver's own state) is dropped, never hashed nor reported. Without `admit` a
path is kept only when it is lexically inside cwd.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from driver.adapters.common.changed_files import relative_to_cwd
from driver.interfaces import PathNotAllowed

Emit = tuple[str, dict[str, Any]]

_TOOL_STATUS = {"completed": "completed", "failed": "failed", "declined": "declined"}
_PLAN_STATUS = {"pending": "pending", "inProgress": "in_progress", "completed": "completed"}
_CHANGE_KIND = {"add": "created", "delete": "deleted", "update": "modified"}
_MAX_TOOL_OUTPUT = 64 * 1024


@dataclass(frozen=True, slots=True)
class FileTouched:
    """A file a completed change wrote or removed: `path` absolute and admitted, `relpath` relative to
    cwd (absolute for a file in another allowed root, as `file.changed` says it)."""

    path: str
    relpath: str
    change: str  # created | modified | deleted


@dataclass(frozen=True, slots=True)
class TurnEnd:
    status: str  # completed | interrupted | failed
    error_message: str | None
    error_info: Any = None


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


@dataclass
class CodexTurn:
    run_id: str
    cwd: str
    thread_id: str
    turn_id: str | None = None
    # The files port's admission (PathNotAllowed outside the allowed roots); None: lexically in cwd.
    admit: Callable[[str], Path] | None = None
    # Codex accepts turn/interrupt only once it has announced the turn (turn/started), which comes
    # just after the turn/start answer: an interrupt sent in between is refused ("no active turn").
    active: bool = False
    final_message_id: str | None = None
    final_message_text: str = ""
    end: TurnEnd | None = None
    last_error: str | None = None
    usage: dict[str, int] = field(
        default_factory=lambda: {
            "input_tokens": 0,
            "output_tokens": 0,
            "cached_input_tokens": 0,
            "reasoning_tokens": 0,
        }
    )
    started_tools: set[str] = field(default_factory=set)
    # Paths of an in-flight file change, for the approval prompt's title.
    change_paths: dict[str, list[str]] = field(default_factory=dict)
    # (absolute path, sha256) of every file.changed of this turn: a file state is reported once.
    reported_files: set[tuple[str, str | None]] = field(default_factory=set)
    _started: set[str] = field(default_factory=set)
    _completed: set[str] = field(default_factory=set)
    _thought_text: dict[str, str] = field(default_factory=dict)
    # Streamed text of messages not yet completed: a steer makes Codex drop the response under way
    # (no item/completed for it), and the turn's end closes it with what was streamed.
    _message_text: dict[str, str] = field(default_factory=dict)
    _tool_output: dict[str, str] = field(default_factory=dict)
    _tool_names: dict[str, str] = field(default_factory=dict)
    _root: Path | None = None  # cwd as admitted (resolved), what relpaths are taken against

    # -- routing --------------------------------------------------------------------------------

    def concerns(self, params: Any) -> bool:
        """Whether a notification belongs to this turn (same thread; same turn once its id is known)."""
        if not isinstance(params, dict):
            return False
        if params.get("threadId") not in (None, self.thread_id):
            return False
        turn_id = params.get("turnId")
        if turn_id is None and isinstance(params.get("turn"), dict):
            turn_id = params["turn"].get("id")
        return self.turn_id is None or turn_id in (None, self.turn_id)

    def handle(self, method: str, params: dict[str, Any]) -> list[Emit | FileTouched]:
        match method:
            case "turn/started":
                turn = params.get("turn") or {}
                if self.turn_id is None and isinstance(turn.get("id"), str):
                    self.turn_id = turn["id"]
                self.active = True
                return []
            case "item/started":
                return self._item_started(params.get("item") or {})
            case "item/completed":
                return self._item_completed(params.get("item") or {})
            case "item/agentMessage/delta":
                return self._delta("message", _str(params.get("itemId")), _str(params.get("delta")))
            case "item/reasoning/summaryTextDelta" | "item/reasoning/textDelta":
                return self._delta("thought", _str(params.get("itemId")), _str(params.get("delta")))
            case "item/commandExecution/outputDelta" | "item/fileChange/outputDelta":
                return self._tool_delta(_str(params.get("itemId")), _str(params.get("delta")))
            case "item/mcpToolCall/progress":
                progress = _str(params.get("message"))
                return self._tool_delta(_str(params.get("itemId")), progress + "\n" if progress else "")
            case "turn/diff/updated":
                # The turn's whole diff so far: every file in it is reported (the adapter skips a file
                # state it already reported from a fileChange item).
                return list(self._diff_files(_str(params.get("diff"))))
            case "turn/plan/updated":
                return [("plan.updated", {"entries": self._plan(params.get("plan"))})]
            case "thread/tokenUsage/updated":
                return self._usage(params.get("tokenUsage") or {})
            case "error":
                error = params.get("error") or {}
                if not params.get("willRetry"):
                    self.last_error = _describe_error(error)
                return []
            case "turn/completed":
                turn = params.get("turn") or {}
                error = turn.get("error")
                message = _describe_error(error) if isinstance(error, dict) else self.last_error
                self.end = TurnEnd(_str(turn.get("status")) or "completed", message, error)
                return [*self._close_open_messages(), *self._close_open_tools()]
            case _:
                return []

    # -- items ----------------------------------------------------------------------------------

    def _item_started(self, item: dict[str, Any]) -> list[Emit | FileTouched]:
        item_id, kind = _str(item.get("id")), item.get("type")
        if not item_id:
            return []
        if kind == "agentMessage":
            return self._start("message", item_id)
        if kind == "reasoning":
            return self._start("thought", item_id)
        if kind in ("commandExecution", "fileChange", "mcpToolCall", "dynamicToolCall", "webSearch"):
            return self._tool_started(item)
        return []

    def _start(self, what: str, item_id: str) -> list[Emit | FileTouched]:
        if item_id in self._started:
            return []
        self._started.add(item_id)
        if what == "message":
            # Codex streams one message at a time: one still open was dropped (a steer restarts the
            # response): close it first, so the timeline keeps its order.
            return [*self._close_open_messages(), ("message.started", {"message_id": item_id, "role": "assistant"})]
        return [("thought.started", {"thought_id": item_id, "text": ""})]

    def _delta(self, what: str, item_id: str, text: str) -> list[Emit | FileTouched]:
        if not item_id or not text or item_id in self._completed:
            return []
        out = self._start(what, item_id)
        if what == "message":
            self._message_text[item_id] = self._message_text.get(item_id, "") + text
            out.append(("message.delta", {"message_id": item_id, "text": text}))
        else:
            self._thought_text[item_id] = self._thought_text.get(item_id, "") + text
            out.append(("thought.delta", {"thought_id": item_id, "text": text}))
        return out

    def _tool_started(self, item: dict[str, Any]) -> list[Emit | FileTouched]:
        item_id = _str(item.get("id"))
        if item_id in self.started_tools:
            return []
        self.started_tools.add(item_id)
        name, title, tool_input = _describe_tool(item, self.cwd)
        self._tool_names[item_id] = name
        if item.get("type") == "fileChange":
            self.change_paths[item_id] = [c["path"] for c in tool_input.get("changes", [])]
        return [("tool.started", {"tool_call_id": item_id, "name": name, "title": title, "input": tool_input})]

    def running_tool(self, name: str) -> str | None:
        """The id of the latest started, not yet completed tool call named `name`."""
        for item_id in reversed(self._tool_names):
            if self._tool_names[item_id] == name and item_id not in self._completed:
                return item_id
        return None

    def _tool_delta(self, item_id: str, text: str) -> list[Emit | FileTouched]:
        if not item_id or not text or item_id in self._completed:
            return []
        kept = self._tool_output.get(item_id, "")
        if len(kept) < _MAX_TOOL_OUTPUT:
            self._tool_output[item_id] = kept + text[: _MAX_TOOL_OUTPUT - len(kept)]
        return [("tool.output.delta", {"tool_call_id": item_id, "text": text})]

    def _item_completed(self, item: dict[str, Any]) -> list[Emit | FileTouched]:
        item_id, kind = _str(item.get("id")), item.get("type")
        if not item_id or item_id in self._completed:
            return []
        if kind == "agentMessage":
            self._completed.add(item_id)
            self._message_text.pop(item_id, None)
            text = _str(item.get("text"))
            self.final_message_id, self.final_message_text = item_id, text
            return [
                *self._start("message", item_id),
                ("message.completed", {"message_id": item_id, "role": "assistant", "text": text}),
            ]
        if kind == "reasoning":
            self._completed.add(item_id)
            parts = item.get("summary") or item.get("content") or []
            text = "\n".join(p for p in parts if isinstance(p, str)) or self._thought_text.get(item_id, "")
            return [*self._start("thought", item_id), ("thought.completed", {"thought_id": item_id, "text": text})]
        if kind in ("commandExecution", "fileChange", "mcpToolCall", "dynamicToolCall", "webSearch"):
            self._completed.add(item_id)
            out: list[Emit | FileTouched] = [*self._tool_started(item)]
            status = _TOOL_STATUS.get(_str(item.get("status")), "completed" if kind == "webSearch" else "cancelled")
            exit_code = item.get("exitCode")
            if kind == "commandExecution" and status == "completed" and isinstance(exit_code, int) and exit_code:
                status = "failed"
            output = _tool_output(item) or self._tool_output.pop(item_id, "")
            out.append(
                (
                    "tool.completed",
                    {
                        "tool_call_id": item_id,
                        "status": status,
                        "output": output,
                        "exit_code": exit_code if isinstance(exit_code, int) else None,
                    },
                )
            )
            if kind == "fileChange" and status == "completed":
                out.extend(self._files(item))
            self.change_paths.pop(item_id, None)
            return out
        return []

    def _files(self, item: dict[str, Any]) -> list[Emit | FileTouched]:
        out: list[FileTouched | None] = []
        for change in item.get("changes") or []:
            if not isinstance(change, dict) or not isinstance(change.get("path"), str):
                continue
            path = change["path"]
            kind = change.get("kind") or {}
            change_type = _CHANGE_KIND.get(_str(kind.get("type")), "modified")
            move_to = kind.get("move_path")
            if change_type == "modified" and isinstance(move_to, str) and move_to:
                # A rename: the old path is gone, the new one holds the content.
                out.append(self._touched(path, "deleted"))
                path = move_to
                change_type = "created"
            out.append(self._touched(path, change_type))
        return [t for t in out if t is not None]

    def _diff_files(self, diff: str) -> list[FileTouched]:
        out: list[FileTouched | None] = []
        old: str | None = None
        for line in diff.splitlines():
            if line.startswith("--- "):
                old = _diff_path(line[4:], "a/")
            elif line.startswith("+++ ") and old is not None:
                new = _diff_path(line[4:], "b/")
                if new is None:
                    out.append(self._touched(old, "deleted"))
                else:
                    if old is not None and old != new and old != "/dev/null":
                        out.append(self._touched(old, "deleted"))
                    change = "created" if old in ("/dev/null", None) or old != new else "modified"
                    out.append(self._touched(new, change))
                old = None
        return [t for t in out if t is not None]

    def _touched(self, path: str, change: str) -> FileTouched | None:
        """The file `path` (as Codex named it, relative to cwd or absolute) if it is admitted."""
        joined = os.path.join(self.cwd, path)
        if "\0" in joined:
            return None
        if self.admit is None:
            normal = os.path.normpath(joined)
            if normal != self.cwd and not normal.startswith(self.cwd.rstrip("/") + "/"):
                return None
            return FileTouched(normal, os.path.relpath(normal, self.cwd), change)
        try:
            admitted = self.admit(joined)
            if self._root is None:
                self._root = self.admit(self.cwd)
        except PathNotAllowed:
            return None
        return FileTouched(str(admitted), relative_to_cwd(admitted, self._root), change)

    def _close_open_messages(self) -> list[Emit | FileTouched]:
        """Messages Codex started and never completed (dropped for a steer, or cut by an interrupt):
        completed with the text streamed, so every message.started has its message.completed."""
        out: list[Emit | FileTouched] = []
        for item_id, text in self._message_text.items():
            if item_id not in self._completed:
                self._completed.add(item_id)
                out.append(("message.completed", {"message_id": item_id, "role": "assistant", "text": text}))
        self._message_text = {}
        return out

    def _close_open_tools(self) -> list[Emit | FileTouched]:
        """A turn that ends (interrupted, failed) with tools still running: end them as cancelled, so
        every tool.started has its tool.completed."""
        out: list[Emit | FileTouched] = []
        for item_id in sorted(self.started_tools - self._completed):
            self._completed.add(item_id)
            output = self._tool_output.pop(item_id, "")
            payload = {"tool_call_id": item_id, "status": "cancelled", "output": output, "exit_code": None}
            out.append(("tool.completed", payload))
        return out

    # -- plan, usage -------------------------------------------------------------------------

    @staticmethod
    def _plan(plan: Any) -> list[dict[str, str]]:
        entries = []
        for step in plan if isinstance(plan, list) else []:
            if isinstance(step, dict):
                status = _PLAN_STATUS.get(_str(step.get("status")), _str(step.get("status")) or "pending")
                entries.append({"content": _str(step.get("step")), "status": status})
        return entries

    def _usage(self, token_usage: dict[str, Any]) -> list[Emit | FileTouched]:
        last = token_usage.get("last")
        if not isinstance(last, dict):
            return []
        # `last` is the usage of one model response; a turn makes several, so sum them.
        for ours, theirs in (
            ("input_tokens", "inputTokens"),
            ("output_tokens", "outputTokens"),
            ("cached_input_tokens", "cachedInputTokens"),
            ("reasoning_tokens", "reasoningOutputTokens"),
        ):
            value = last.get(theirs)
            if isinstance(value, int):
                self.usage[ours] += value
        return [("usage.updated", {**self.usage, "cost_usd": None})]

    @property
    def usage_payload(self) -> dict[str, Any]:
        return {**self.usage, "cost_usd": None}


def _diff_path(text: str, prefix: str) -> str | None:
    """The path of a unified diff's `---`/`+++` line (`/dev/null` stays as is on the old side; None
    for a deleted file's new side)."""
    path = text.split("\t", 1)[0].strip()
    if path == "/dev/null":
        return None if prefix == "b/" else path
    return path[len(prefix) :] if path.startswith(prefix) else path


def _describe_error(error: dict[str, Any]) -> str:
    message = _str(error.get("message")) or "codex reported an error"
    details = _str(error.get("additionalDetails"))
    info = error.get("codexErrorInfo")
    label = info if isinstance(info, str) else (next(iter(info)) if isinstance(info, dict) and info else None)
    text = f"{message} ({details})" if details else message
    return f"{label}: {text}" if label else text


def _describe_tool(item: dict[str, Any], cwd: str) -> tuple[str, str, dict[str, Any]]:
    kind = item.get("type")
    if kind == "commandExecution":
        command = _str(item.get("command"))
        return "shell", command, {"command": command, "cwd": _str(item.get("cwd")) or cwd}
    if kind == "fileChange":
        changes = []
        for change in item.get("changes") or []:
            if isinstance(change, dict) and isinstance(change.get("path"), str):
                path = os.path.relpath(os.path.join(cwd, change["path"]), cwd)
                change_kind = (change.get("kind") or {}).get("type")
                changes.append({"path": path, "kind": _CHANGE_KIND.get(_str(change_kind), "modified")})
        title = "Edit " + ", ".join(c["path"] for c in changes) if changes else "Edit files"
        return "apply_patch", title, {"changes": changes}
    if kind == "mcpToolCall":
        name = f"{_str(item.get('server'))}.{_str(item.get('tool'))}"
        return name, name, {"arguments": item.get("arguments")}
    if kind == "dynamicToolCall":
        name = _str(item.get("tool"))
        return name, name, {"arguments": item.get("arguments")}
    query = _str(item.get("query"))
    return "web_search", f"Search: {query}", {"query": query}


def _tool_output(item: dict[str, Any]) -> Any:
    kind = item.get("type")
    if kind == "commandExecution":
        return _str(item.get("aggregatedOutput"))
    if kind == "mcpToolCall":
        if isinstance(item.get("error"), dict):
            return _str(item["error"].get("message"))
        result = item.get("result")
        return result.get("content") if isinstance(result, dict) else None
    if kind == "dynamicToolCall":
        return item.get("contentItems")
    return None
