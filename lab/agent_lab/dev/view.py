"""What the terminal chat shows, without I/O: the status line and the transcript of stored events."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent_lab.dev.common import AGENT_PREFIX, THINKING_PREFIX


def short(value: Any, limit: int = 100) -> str:
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
        if kind == "input.steered":
            how = "into the running turn" if p.get("mode") == "native" else "as one more turn"
            return f"[steered] {how}: {short(str(p.get('text') or ''), 160)}"
        if kind == "run.cancelled":
            details = p.get("details") or {}
            return f"[run cancelled] by {p.get('requested_by')} (phase: {details.get('phase')})"
        if kind == "tool.started":
            tool_id = str(p.get("tool_call_id"))
            name = str(p.get("name") or "tool")
            self._tools[tool_id] = name
            detail = short(p.get("title") or p.get("input") or "")
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
            return "[plan] " + short("; ".join(f"{e.get('status')}: {e.get('content')}" for e in entries), 160)
        if kind == "diagnostic.reported":
            return f"[{p.get('severity')}] {p.get('code')}: {p.get('message')}"
        if kind == "runtime.session.reset":
            return "[session] the provider could not resume and started a fresh session"
        if kind == "host_tool.called":
            return f"[host tool] {p.get('name')} was called, but dev offers no host tools"
        return None
