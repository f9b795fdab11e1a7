"""A fake Anthropic Messages API for running the real Claude Code CLI offline.

`POST /v1/messages` answers with a scripted assistant turn, streamed as server-sent events exactly as
the real API frames them (message_start, content_block_start/delta/stop, message_delta with usage,
message_stop), or as one JSON message when the request does not ask for a stream. The script is read
from markers in the latest user text of the conversation (see `plan_reply`; besides the shared
markers, `[[tool:NAME:JSON]]` calls any tool by name, e.g. an MCP tool); whether a tool result
already follows that text decides between "call the tool" and "report it done", so the answer depends
only on the request, never on server-side counters.

Anything else the CLI calls is recorded in `other_requests` and answered sensibly (count_tokens with a
rough count, the rest with an Anthropic-style 404), so a test can prove the CLI stayed on the one
endpoint it needs.

Run standalone: `python -m agent_lab.testing.fake_anthropic --port 8089`.
"""

from __future__ import annotations

import argparse
import json
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

from agent_lab.testing.http_fake import JsonHandler, QuietServer, ServedFake, listen_or_exit, serve_until_interrupted
from agent_lab.testing.script import (
    DEFAULT_TEXT,
    ERROR_MESSAGE,
    SLOW_INTERVAL_S,
    THINKING_TEXT,
    read_script,
    slow_text,
)

_VERBS = ("say", "shell", "write", "tool")


# --------------------------------------------------------------------------------------------------
# The script: request body -> planned reply (no I/O)


@dataclass(frozen=True, slots=True)
class Block:
    """One content block of the planned reply."""

    type: str  # "text" | "thinking" | "tool_use"
    text: str = ""
    tool_name: str = ""
    tool_input: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Reply:
    blocks: tuple[Block, ...] = ()
    error: bool = False
    slow: bool = False

    @property
    def stop_reason(self) -> str:
        return "tool_use" if any(b.type == "tool_use" for b in self.blocks) else "end_turn"


def _blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return [b for b in content if isinstance(b, dict)]
    return []


def latest_user_turn(body: dict[str, Any]) -> tuple[str, bool]:
    """Return the text of the latest user message that carries text (the prompt), and whether a
    tool result arrived after it (so the scripted tool call has been answered)."""
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    tool_result_after = False
    for message in reversed(messages):
        if message.get("role") != "user":
            continue
        blocks = _blocks(message.get("content"))
        texts = [str(b.get("text", "")) for b in blocks if b.get("type") == "text"]
        has_result = any(b.get("type") == "tool_result" for b in blocks)
        prompt_texts = [t for t in texts if "[[" in t] or ([] if has_result else texts)
        if prompt_texts:
            return "\n".join(prompt_texts), tool_result_after
        if has_result:
            tool_result_after = True
    return "", tool_result_after


def plan_reply(body: dict[str, Any]) -> Reply:
    text, answered = latest_user_turn(body)
    script = read_script(text, _VERBS)
    lead: tuple[Block, ...] = (Block("thinking", THINKING_TEXT),) if script.think else ()
    if script.error:
        return Reply(error=True)
    if script.slow:
        return Reply((*lead, Block("text", slow_text(script.slow_chunks))), slow=True)
    if script.verb is None:
        return Reply((*lead, Block("text", DEFAULT_TEXT)))
    verb, arg = script.verb, script.arg
    if verb == "say":
        return Reply((*lead, Block("text", arg)))
    if verb == "shell":
        if answered:
            return Reply((*lead, Block("text", "shell done")))
        return Reply(
            (
                *lead,
                Block("tool_use", tool_name="Bash", tool_input={"command": arg, "description": "Run " + arg}),
            )
        )
    if verb == "tool":
        # tool:NAME:JSON calls any tool by name (e.g. an MCP tool `mcp__host__echo`), then "tool done".
        if answered:
            return Reply((*lead, Block("text", "tool done")))
        name, _, raw = arg.partition(":")
        arguments = json.loads(raw) if raw.strip() else {}
        return Reply((*lead, Block("tool_use", tool_name=name, tool_input=arguments)))
    # write: RELPATH:CONTENT
    if answered:
        return Reply((*lead, Block("text", "write done")))
    relpath, _, content = arg.partition(":")
    return Reply((*lead, Block("tool_use", tool_name="Write", tool_input={"file_path": relpath, "content": content})))


def _chunks(text: str, slow: bool) -> list[str]:
    """Split text into the pieces streamed as deltas: words when slow, about four pieces otherwise."""
    if slow:
        words = text.split(" ")
        return [w + (" " if i < len(words) - 1 else "") for i, w in enumerate(words)]
    size = max(1, -(-len(text) // 4))
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def estimate_tokens(body: Any) -> int:
    return max(1, len(json.dumps(body)) // 4)


def _complete_message(reply: Reply, model: str, input_tokens: int, tool_ids: list[str]) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    ids = iter(tool_ids)
    for block in reply.blocks:
        if block.type == "text":
            content.append({"type": "text", "text": block.text})
        elif block.type == "thinking":
            content.append({"type": "thinking", "thinking": block.text, "signature": "fake-signature"})
        else:
            content.append({"type": "tool_use", "id": next(ids), "name": block.tool_name, "input": block.tool_input})
    return {
        "id": "msg_fake_" + uuid.uuid4().hex[:20],
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reply.stop_reason,
        "stop_sequence": None,
        "usage": {
            "input_tokens": input_tokens,
            "output_tokens": sum(len(_chunks(b.text, False)) for b in reply.blocks) + 1,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }


# --------------------------------------------------------------------------------------------------
# The HTTP server


class _Handler(JsonHandler):
    server: _Server
    request_id_header = "request-id"

    def do_GET(self) -> None:
        self.server.fake.record_other("GET", self.path, None)
        self._not_found()

    def do_HEAD(self) -> None:
        self.server.fake.record_other("HEAD", self.path, None)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        body = self._read_body()
        path = self.path.split("?", 1)[0]
        if path == "/v1/messages" and isinstance(body, dict):
            self.server.fake.record_message(body, dict(self.headers))
            self._messages(body)
        elif path == "/v1/messages/count_tokens":
            self.server.fake.record_other("POST", self.path, body)
            self._send_json(200, {"input_tokens": estimate_tokens(body)})
        else:
            self.server.fake.record_other("POST", self.path, body)
            self._not_found()

    def _not_found(self) -> None:
        self._send_json(404, {"type": "error", "error": {"type": "not_found_error", "message": "not found"}})

    def _messages(self, body: dict[str, Any]) -> None:
        reply = plan_reply(body)
        if reply.error:
            self._send_json(500, {"type": "error", "error": {"type": "api_error", "message": ERROR_MESSAGE}})
            return
        model = str(body.get("model") or "claude-fake")
        input_tokens = estimate_tokens(body.get("messages"))
        tool_ids = ["toolu_fake_" + uuid.uuid4().hex[:20] for b in reply.blocks if b.type == "tool_use"]
        message = _complete_message(reply, model, input_tokens, tool_ids)
        if not body.get("stream"):
            self._send_json(200, message)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("request-id", "req_fake_" + uuid.uuid4().hex[:12])
        self.end_headers()
        try:
            self._stream(reply, message)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client went away (e.g. an interrupt): stop streaming

    def _event(self, name: str, data: dict[str, Any]) -> None:
        payload = f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()
        self.wfile.write(f"{len(payload):x}\r\n".encode() + payload + b"\r\n")
        self.wfile.flush()

    def _pace(self, slow: bool) -> None:
        if slow and self.server.fake.closing.wait(SLOW_INTERVAL_S):
            raise BrokenPipeError("fake server closing")

    def _stream(self, reply: Reply, message: dict[str, Any]) -> None:
        usage = message["usage"]
        start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
        self._event("message_start", {"type": "message_start", "message": start})
        self._event("ping", {"type": "ping"})
        for index, block in enumerate(message["content"]):
            kind = block["type"]
            if kind == "text":
                self._event(
                    "content_block_start",
                    {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}},
                )
                for piece in _chunks(block["text"], reply.slow):
                    self._pace(reply.slow)
                    delta = {"type": "text_delta", "text": piece}
                    self._event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
            elif kind == "thinking":
                start_block: dict[str, Any] = {"type": "thinking", "thinking": "", "signature": ""}
                self._event(
                    "content_block_start", {"type": "content_block_start", "index": index, "content_block": start_block}
                )
                for piece in _chunks(block["thinking"], False):
                    delta = {"type": "thinking_delta", "thinking": piece}
                    self._event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
                delta = {"type": "signature_delta", "signature": block["signature"]}
                self._event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
            else:
                start_block = {
                    "type": "tool_use",
                    "id": block["id"],
                    "name": block["name"],
                    "input": {},
                }
                self._event(
                    "content_block_start", {"type": "content_block_start", "index": index, "content_block": start_block}
                )
                for piece in _chunks(json.dumps(block["input"]), False):
                    delta = {"type": "input_json_delta", "partial_json": piece}
                    self._event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
            self._event("content_block_stop", {"type": "content_block_stop", "index": index})
        self._event(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": usage["output_tokens"]},
            },
        )
        self._event("message_stop", {"type": "message_stop"})


class _Server(QuietServer):
    fake: FakeAnthropic


class FakeAnthropic(ServedFake):
    """The fake endpoint, served from a background thread. Use as a context manager or call close()."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.requests: list[dict[str, Any]] = []
        # The headers of each `/v1/messages` request (names lower-cased), to check which key arrived.
        self.request_headers: list[dict[str, str]] = []
        self.other_requests: list[tuple[str, str, Any]] = []
        self._lock = threading.Lock()
        server = _Server((host, port), _Handler)
        server.fake = self
        self._serve(server, "fake-anthropic")

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def record_message(self, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        with self._lock:
            self.requests.append(body)
            self.request_headers.append({k.lower(): v for k, v in (headers or {}).items()})

    def record_other(self, method: str, path: str, body: Any) -> None:
        with self._lock:
            self.other_requests.append((method, path, body))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8089)
    args = parser.parse_args(argv)
    label = "fake Anthropic Messages API"
    fake = listen_or_exit(lambda: FakeAnthropic(args.host, args.port), args.host, args.port, label)
    serve_until_interrupted(fake, label)


if __name__ == "__main__":
    main()
