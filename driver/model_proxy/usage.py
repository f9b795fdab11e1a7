"""Reading the usage an upstream reports, from the bytes the proxy forwards (no I/O).

The reader sees every chunk before the provider does, and never changes one. For a stream of
server-sent events it splits events across chunk boundaries and decodes only the few that carry
usage or end the answer: Anthropic's `message_start` (input and cache figures, the model) and
`message_delta` (output tokens), then `message_stop`; OpenAI Responses' `response.completed` /
`response.incomplete` / `response.failed` (everything); Chat Completions' chunk with `usage`, then
`[DONE]`. A JSON answer (no stream) is read whole at its end.

Figures are normalised: `input_tokens` is the whole input (Anthropic reports cache reads and writes
beside `input_tokens`; they are added), `cached_input_tokens` the part read from a cache.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

Dialect = Literal["anthropic", "responses", "chat"]

# Bound on what is kept to find usage: a JSON answer bigger than this is forwarded but not read.
MAX_JSON_BYTES = 8 * 1024 * 1024
# Bound on one pending SSE event (an event never ends in a stream that is not SSE after all).
MAX_EVENT_BYTES = 4 * 1024 * 1024

_TERMINAL_TYPES = {
    "anthropic": (b"message_stop",),
    "responses": (b"response.completed", b"response.incomplete", b"response.failed"),
}


def dialect_of(path: str) -> Dialect | None:
    """Which API a request path speaks, by its last segments."""
    bare = path.split("?", 1)[0].rstrip("/")
    if bare.endswith("/messages"):
        return "anthropic"
    if bare.endswith("/responses"):
        return "responses"
    if bare.endswith("/chat/completions"):
        return "chat"
    return None


@dataclass(slots=True)
class Usage:
    model: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    cache_write_tokens: int = 0
    reported: bool = False  # the upstream said something about usage


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


class UsageReader:
    """Fed each chunk of one answer; `feed` returns True once the answer's final event went by."""

    def __init__(self, dialect: Dialect, streaming: bool) -> None:
        self.dialect = dialect
        self.streaming = streaming
        self.usage = Usage()
        self.finished = False
        self._pending = bytearray()
        self._overflow = False
        # What an event we read contains, at least: usage, a start, or the answer's end.
        self._tokens = (b'"usage"', b"message_start", b"[DONE]", *_TERMINAL_TYPES.get(dialect, ()))

    def feed(self, chunk: bytes) -> bool:
        if self._overflow:
            return self.finished
        self._pending += chunk
        if not self.streaming:
            if len(self._pending) > MAX_JSON_BYTES:
                self._drop()
            return False
        end = _complete_end(self._pending)
        if end:
            complete = bytes(self._pending[:end])
            del self._pending[:end]
            # One scan of everything complete so far: most of a stream (text deltas) holds nothing we
            # read, and is passed over without being split into events.
            if any(token in complete for token in self._tokens):
                for event in complete.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n\n"):
                    self._event(event)
        if len(self._pending) > MAX_EVENT_BYTES:
            self._drop()
        return self.finished

    def close(self) -> Usage:
        """The answer ended: read a JSON body, or an unterminated last event."""
        if not self._overflow and self._pending:
            if self.streaming:
                self._event(bytes(self._pending))
            else:
                self._json_body(bytes(self._pending))
        self._pending.clear()
        return self.usage

    def _drop(self) -> None:
        self._overflow = True
        self._pending.clear()

    # -- SSE ------------------------------------------------------------------------------------------
    def _event(self, raw: bytes) -> None:
        data = b"\n".join(_data_lines(raw))
        if not data:
            return
        if self.dialect == "chat" and data.strip() == b"[DONE]":
            self.finished = True
            return
        # Cheap test first: most events (deltas) carry neither usage nor an ending.
        terminal = any(t in data for t in _TERMINAL_TYPES.get(self.dialect, ()))
        if not terminal and b'"usage"' not in data and b"message_start" not in data:
            return
        try:
            obj = json.loads(data)
        except ValueError:
            return
        if isinstance(obj, dict):
            self._object(obj)

    def _object(self, obj: dict[str, Any]) -> None:
        kind = obj.get("type")
        if self.dialect == "anthropic":
            if kind == "message_start" and isinstance(obj.get("message"), dict):
                message = obj["message"]
                self._model(message.get("model"))
                self._anthropic(message.get("usage"), start=True)
            elif kind == "message_delta":
                self._anthropic(obj.get("usage"), start=False)
            elif kind == "message_stop":
                self.finished = True
        elif self.dialect == "responses":
            response = obj.get("response")
            if kind in ("response.completed", "response.incomplete", "response.failed") and isinstance(response, dict):
                self._model(response.get("model"))
                self._openai(response.get("usage"))
                self.finished = True
            elif kind == "response.created" and isinstance(response, dict):
                self._model(response.get("model"))
        else:
            self._model(obj.get("model"))
            self._openai(obj.get("usage"))

    # -- JSON -----------------------------------------------------------------------------------------
    def _json_body(self, raw: bytes) -> None:
        try:
            obj = json.loads(raw)
        except ValueError:
            return
        if not isinstance(obj, dict):
            return
        self._model(obj.get("model"))
        if self.dialect == "anthropic":
            self._anthropic(obj.get("usage"), start=True)
        else:
            self._openai(obj.get("usage"))
        self.finished = True

    # -- figures --------------------------------------------------------------------------------------
    def _model(self, model: Any) -> None:
        if isinstance(model, str) and model and not self.usage.model:
            self.usage.model = model

    def _anthropic(self, usage: Any, *, start: bool) -> None:
        if not isinstance(usage, dict):
            return
        u = self.usage
        u.reported = True
        if start or "input_tokens" in usage:
            read = _int(usage.get("cache_read_input_tokens"))
            written = _int(usage.get("cache_creation_input_tokens"))
            u.input_tokens = _int(usage.get("input_tokens")) + read + written
            u.cached_input_tokens = read
            u.cache_write_tokens = written
        if "output_tokens" in usage:
            # message_delta's figure is cumulative for the message: the last one is the total.
            u.output_tokens = _int(usage.get("output_tokens"))

    def _openai(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        u = self.usage
        u.reported = True
        # Responses: input_tokens / output_tokens; Chat Completions: prompt_tokens / completion_tokens.
        u.input_tokens = _int(usage.get("input_tokens", usage.get("prompt_tokens")))
        u.output_tokens = _int(usage.get("output_tokens", usage.get("completion_tokens")))
        details = usage.get("input_tokens_details", usage.get("prompt_tokens_details"))
        if isinstance(details, dict):
            u.cached_input_tokens = min(_int(details.get("cached_tokens")), u.input_tokens)


def _complete_end(buf: bytearray) -> int:
    """Index just past the last complete event (a blank line ends one: \\n\\n, \\r\\n\\r\\n, \\r\\r); 0: none."""
    best = 0
    for sep in (b"\n\n", b"\r\n\r\n", b"\r\r"):
        i = buf.rfind(sep)
        if i >= 0:
            best = max(best, i + len(sep))
    return best


def _data_lines(raw: bytes) -> list[bytes]:
    out: list[bytes] = []
    for line in raw.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n"):
        if line.startswith(b"data:"):
            value = line[5:]
            out.append(value[1:] if value.startswith(b" ") else value)
    return out
