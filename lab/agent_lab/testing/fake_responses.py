"""A fake OpenAI Responses API (`POST /v1/responses`, server-sent events) for running Codex offline.

Every streamed event is built from the `openai` package's own models (`openai.types.responses.*`) and
validated there, so what the real Codex binary parses here has the shape the real API sends:
response.created / in_progress, output_item.added, content or summary parts, text/argument deltas,
output_item.done, and response.completed with usage.

The script is read from markers in the latest user text of the request's `input` (`responses_plan`).
Tool calls answer with the tool the request itself offers: for `[[shell:CMD]]` Codex's `exec_command`
(or `shell` / `shell_command` / `local_shell`, whichever the request lists); for `[[write:PATH:TEXT]]`
Codex's `apply_patch` (a freeform custom tool for current models, a function for others). An extra
marker, `[[mcp:SERVER:TOOL:JSON_ARGS]]`, calls an MCP tool: Codex defers MCP tools behind its
`tool_search` tool, so the fake searches first, then calls the function the search exposed, then
replies "mcp done: <tool output>". Whether a
tool output already follows the prompt decides between "call the tool" and "report it done", so the
answer depends only on the request, never on server-side counters.

`base_url` includes `/v1` (as OPENAI_BASE_URL does). Anything other than the responses endpoint is
recorded in `other_requests`; `GET /v1/models` gets a one-model list, the rest a 404.

Run standalone: `python -m agent_lab.testing.fake_responses --port 8090`.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseContentPartAddedEvent,
    ResponseContentPartDoneEvent,
    ResponseCreatedEvent,
    ResponseCustomToolCall,
    ResponseCustomToolCallInputDeltaEvent,
    ResponseCustomToolCallInputDoneEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionCallArgumentsDoneEvent,
    ResponseFunctionToolCall,
    ResponseInProgressEvent,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseReasoningItem,
    ResponseReasoningSummaryPartAddedEvent,
    ResponseReasoningSummaryPartDoneEvent,
    ResponseReasoningSummaryTextDeltaEvent,
    ResponseReasoningSummaryTextDoneEvent,
    ResponseTextDeltaEvent,
    ResponseTextDoneEvent,
    ResponseToolSearchCall,
    ResponseUsage,
)
from openai.types.responses.response_output_item import LocalShellCall, LocalShellCallAction
from openai.types.responses.response_reasoning_item import Summary
from openai.types.responses.response_reasoning_summary_part_added_event import Part as AddedPart
from openai.types.responses.response_reasoning_summary_part_done_event import Part as DonePart
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails
from pydantic import BaseModel

from agent_lab.testing.http_fake import JsonHandler, QuietServer, ServedFake, listen_or_exit, serve_until_interrupted
from agent_lab.testing.responses_plan import (
    Reply,
    Step,
    add_file_patch,
    chunks,
    estimate_tokens,
    offered_tools,
    plan_reply,
)
from agent_lab.testing.script import (
    ERROR_MESSAGE,
    SLOW_INTERVAL_S,
)

# --------------------------------------------------------------------------------------------------
# Events: planned reply -> openai models


class _Stream:
    """Builds the event sequence for one response, numbering events as the API does."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.response_id = "resp_fake_" + uuid.uuid4().hex[:24]
        self.seq = 0
        self.output: list[Any] = []

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq - 1

    def response(self, status: str, usage: ResponseUsage | None = None) -> Response:
        return Response(
            id=self.response_id,
            created_at=time.time(),
            model=self.model,
            object="response",
            output=list(self.output) if status == "completed" else [],
            parallel_tool_calls=True,
            tool_choice="auto",
            tools=[],
            status=status,  # type: ignore[arg-type]
            usage=usage,
        )


def _event_name(event: BaseModel) -> str:
    return str(getattr(event, "type"))  # noqa: B009 - every event model has `type`


# --------------------------------------------------------------------------------------------------
# The HTTP server


class _Handler(JsonHandler):
    server: _Server
    request_id_header = "x-request-id"

    def do_GET(self) -> None:
        self.server.fake.record_other("GET", self.path, None)
        if self.path.split("?", 1)[0] in ("/v1/models", "/models"):
            model = {"id": "gpt-5.5", "object": "model", "created": 0, "owned_by": "fake"}
            self._send_json(200, {"object": "list", "data": [model]})
        else:
            self._not_found()

    def do_POST(self) -> None:
        body = self._read_body()
        path = self.path.split("?", 1)[0]
        if path in ("/v1/responses", "/responses") and isinstance(body, dict):
            self.server.fake.record_request(body, dict(self.headers))
            self._responses(body)
        else:
            self.server.fake.record_other("POST", self.path, body)
            self._not_found()

    def _not_found(self) -> None:
        self._send_json(404, {"error": {"message": "not found", "type": "invalid_request_error", "code": None}})

    def _responses(self, body: dict[str, Any]) -> None:
        reply = plan_reply(body)
        if reply.error:
            error = {"message": ERROR_MESSAGE, "type": "server_error", "param": None, "code": "server_error"}
            self._send_json(500, {"error": error})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("x-request-id", "req_fake_" + uuid.uuid4().hex[:12])
        self.end_headers()
        try:
            self._stream(reply, body)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client went away (an interrupt): stop streaming

    def _send(self, event: BaseModel) -> None:
        data = event.model_dump_json(exclude_unset=True, by_alias=True)
        payload = f"event: {_event_name(event)}\ndata: {data}\n\n".encode()
        self.wfile.write(f"{len(payload):x}\r\n".encode() + payload + b"\r\n")
        self.wfile.flush()

    def _pace(self, slow: bool) -> None:
        if slow and self.server.fake.closing.wait(SLOW_INTERVAL_S):
            raise BrokenPipeError("fake server closing")

    def _stream(self, reply: Reply, body: dict[str, Any]) -> None:
        s = _Stream(str(body.get("model") or "gpt-5.5"))
        self._send(
            ResponseCreatedEvent(
                type="response.created", sequence_number=s.next_seq(), response=s.response("in_progress")
            )
        )
        self._send(
            ResponseInProgressEvent(
                type="response.in_progress", sequence_number=s.next_seq(), response=s.response("in_progress")
            )
        )
        output_tokens = 0
        reasoning_tokens = 0
        for index, step in enumerate(reply.steps):
            if step.type == "reasoning":
                self._reasoning(s, index, step.text)
                reasoning_tokens += estimate_tokens(step.text)
            elif step.type == "message":
                self._message(s, index, step.text, reply.slow)
                output_tokens += len(chunks(step.text, reply.slow))
            else:
                self._tool_call(s, index, step, offered_tools(body))
                output_tokens += 10
        usage = ResponseUsage(
            input_tokens=estimate_tokens(body.get("input")),
            input_tokens_details=InputTokensDetails(cached_tokens=0, cache_write_tokens=0),
            output_tokens=output_tokens + reasoning_tokens,
            output_tokens_details=OutputTokensDetails(reasoning_tokens=reasoning_tokens),
            total_tokens=estimate_tokens(body.get("input")) + output_tokens + reasoning_tokens,
        )
        self._send(
            ResponseCompletedEvent(
                type="response.completed", sequence_number=s.next_seq(), response=s.response("completed", usage)
            )
        )

    def _reasoning(self, s: _Stream, index: int, text: str) -> None:
        item_id = "rs_fake_" + uuid.uuid4().hex[:20]
        started = ResponseReasoningItem(id=item_id, type="reasoning", summary=[])
        self._send(
            ResponseOutputItemAddedEvent(
                type="response.output_item.added", sequence_number=s.next_seq(), output_index=index, item=started
            )
        )
        self._send(
            ResponseReasoningSummaryPartAddedEvent(
                type="response.reasoning_summary_part.added",
                sequence_number=s.next_seq(),
                item_id=item_id,
                output_index=index,
                summary_index=0,
                part=AddedPart(type="summary_text", text=""),
            )
        )
        for piece in chunks(text, False):
            self._send(
                ResponseReasoningSummaryTextDeltaEvent(
                    type="response.reasoning_summary_text.delta",
                    sequence_number=s.next_seq(),
                    item_id=item_id,
                    output_index=index,
                    summary_index=0,
                    delta=piece,
                )
            )
        self._send(
            ResponseReasoningSummaryTextDoneEvent(
                type="response.reasoning_summary_text.done",
                sequence_number=s.next_seq(),
                item_id=item_id,
                output_index=index,
                summary_index=0,
                text=text,
            )
        )
        self._send(
            ResponseReasoningSummaryPartDoneEvent(
                type="response.reasoning_summary_part.done",
                sequence_number=s.next_seq(),
                item_id=item_id,
                output_index=index,
                summary_index=0,
                part=DonePart(type="summary_text", text=text),
            )
        )
        done = ResponseReasoningItem(
            id=item_id, type="reasoning", summary=[Summary(type="summary_text", text=text)], status="completed"
        )
        s.output.append(done)
        self._send(
            ResponseOutputItemDoneEvent(
                type="response.output_item.done", sequence_number=s.next_seq(), output_index=index, item=done
            )
        )

    def _message(self, s: _Stream, index: int, text: str, slow: bool) -> None:
        item_id = "msg_fake_" + uuid.uuid4().hex[:20]
        started = ResponseOutputMessage(id=item_id, type="message", role="assistant", status="in_progress", content=[])
        self._send(
            ResponseOutputItemAddedEvent(
                type="response.output_item.added", sequence_number=s.next_seq(), output_index=index, item=started
            )
        )
        empty = ResponseOutputText(type="output_text", text="", annotations=[])
        self._send(
            ResponseContentPartAddedEvent(
                type="response.content_part.added",
                sequence_number=s.next_seq(),
                item_id=item_id,
                output_index=index,
                content_index=0,
                part=empty,
            )
        )
        for piece in chunks(text, slow):
            self._pace(slow)
            self._send(
                ResponseTextDeltaEvent(
                    type="response.output_text.delta",
                    sequence_number=s.next_seq(),
                    item_id=item_id,
                    output_index=index,
                    content_index=0,
                    delta=piece,
                    logprobs=[],
                )
            )
        self._send(
            ResponseTextDoneEvent(
                type="response.output_text.done",
                sequence_number=s.next_seq(),
                item_id=item_id,
                output_index=index,
                content_index=0,
                text=text,
                logprobs=[],
            )
        )
        full = ResponseOutputText(type="output_text", text=text, annotations=[])
        self._send(
            ResponseContentPartDoneEvent(
                type="response.content_part.done",
                sequence_number=s.next_seq(),
                item_id=item_id,
                output_index=index,
                content_index=0,
                part=full,
            )
        )
        done = ResponseOutputMessage(id=item_id, type="message", role="assistant", status="completed", content=[full])
        s.output.append(done)
        self._send(
            ResponseOutputItemDoneEvent(
                type="response.output_item.done", sequence_number=s.next_seq(), output_index=index, item=done
            )
        )

    def _tool_call(self, s: _Stream, index: int, step: Step, offered: dict[str, str]) -> None:
        call_id = "call_fake_" + uuid.uuid4().hex[:20]
        item_id = "fc_fake_" + uuid.uuid4().hex[:20]
        if step.tool == "tool_search":
            search = ResponseToolSearchCall(
                id=item_id,
                call_id=call_id,
                arguments={"query": step.arg, "limit": 8},
                execution="client",
                status="completed",
                type="tool_search_call",
            )
            self._added_and_done(s, index, search, search)
            return
        if step.tool == "function":
            call = json.loads(step.arg)
            self._function_call(
                s, index, item_id, call_id, call["name"], json.loads(call["arguments"]), call["namespace"]
            )
            return
        if step.tool == "write":
            relpath, _, content = step.arg.partition(":")
            patch = add_file_patch(relpath, content)
            kind = offered.get("apply_patch")
            if kind == "custom":
                self._custom_call(s, index, item_id, call_id, "apply_patch", patch)
                return
            if kind == "function":
                self._function_call(s, index, item_id, call_id, "apply_patch", {"input": patch})
                return
            # No patch tool offered: write through the shell instead.
            command = f"printf %s {json.dumps(content)} > {json.dumps(relpath)}"
        else:
            command = step.arg
        if "exec_command" in offered or not offered:
            self._function_call(s, index, item_id, call_id, "exec_command", {"cmd": command})
        elif "shell_command" in offered:
            self._function_call(s, index, item_id, call_id, "shell_command", {"command": command})
        elif "shell" in offered:
            self._function_call(s, index, item_id, call_id, "shell", {"command": ["bash", "-lc", command]})
        else:
            action = LocalShellCallAction(command=["bash", "-lc", command], env={}, type="exec")
            item = LocalShellCall(
                id=item_id, call_id=call_id, action=action, status="completed", type="local_shell_call"
            )
            self._added_and_done(s, index, item, item)

    def _added_and_done(self, s: _Stream, index: int, started: Any, done: Any) -> None:
        self._send(
            ResponseOutputItemAddedEvent(
                type="response.output_item.added", sequence_number=s.next_seq(), output_index=index, item=started
            )
        )
        s.output.append(done)
        self._send(
            ResponseOutputItemDoneEvent(
                type="response.output_item.done", sequence_number=s.next_seq(), output_index=index, item=done
            )
        )

    def _function_call(
        self,
        s: _Stream,
        index: int,
        item_id: str,
        call_id: str,
        name: str,
        arguments: dict[str, Any],
        namespace: str | None = None,
    ) -> None:
        args = json.dumps(arguments)
        extra: dict[str, Any] = {"namespace": namespace} if namespace else {}
        started = ResponseFunctionToolCall(
            id=item_id, call_id=call_id, name=name, arguments="", type="function_call", status="in_progress", **extra
        )
        self._send(
            ResponseOutputItemAddedEvent(
                type="response.output_item.added", sequence_number=s.next_seq(), output_index=index, item=started
            )
        )
        for piece in chunks(args, False):
            self._send(
                ResponseFunctionCallArgumentsDeltaEvent(
                    type="response.function_call_arguments.delta",
                    sequence_number=s.next_seq(),
                    item_id=item_id,
                    output_index=index,
                    delta=piece,
                )
            )
        self._send(
            ResponseFunctionCallArgumentsDoneEvent(
                type="response.function_call_arguments.done",
                sequence_number=s.next_seq(),
                item_id=item_id,
                output_index=index,
                arguments=args,
            )
        )
        done = ResponseFunctionToolCall(
            id=item_id, call_id=call_id, name=name, arguments=args, type="function_call", status="completed", **extra
        )
        s.output.append(done)
        self._send(
            ResponseOutputItemDoneEvent(
                type="response.output_item.done", sequence_number=s.next_seq(), output_index=index, item=done
            )
        )

    def _custom_call(self, s: _Stream, index: int, item_id: str, call_id: str, name: str, text: str) -> None:
        started = ResponseCustomToolCall(id=item_id, call_id=call_id, name=name, input="", type="custom_tool_call")
        self._send(
            ResponseOutputItemAddedEvent(
                type="response.output_item.added", sequence_number=s.next_seq(), output_index=index, item=started
            )
        )
        for piece in chunks(text, False):
            self._send(
                ResponseCustomToolCallInputDeltaEvent(
                    type="response.custom_tool_call_input.delta",
                    sequence_number=s.next_seq(),
                    item_id=item_id,
                    output_index=index,
                    delta=piece,
                )
            )
        self._send(
            ResponseCustomToolCallInputDoneEvent(
                type="response.custom_tool_call_input.done",
                sequence_number=s.next_seq(),
                item_id=item_id,
                output_index=index,
                input=text,
            )
        )
        done = ResponseCustomToolCall(id=item_id, call_id=call_id, name=name, input=text, type="custom_tool_call")
        s.output.append(done)
        self._send(
            ResponseOutputItemDoneEvent(
                type="response.output_item.done", sequence_number=s.next_seq(), output_index=index, item=done
            )
        )


class _Server(QuietServer):
    fake: FakeResponses


@dataclass
class _Recorded:
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    other: list[tuple[str, str, Any]] = field(default_factory=list)


class FakeResponses(ServedFake):
    """The fake endpoint, served from a background thread. Use as a context manager or call close().

    `requests`: parsed bodies of every `POST /v1/responses`, in arrival order; `request_headers`: their
    headers (to check the API key arrived); `other_requests`: (method, path, body) of anything else."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._recorded = _Recorded()
        self._lock = threading.Lock()
        server = _Server((host, port), _Handler)
        server.fake = self
        self._serve(server, "fake-responses")

    @property
    def requests(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._recorded.requests)

    @property
    def request_headers(self) -> list[dict[str, str]]:
        with self._lock:
            return list(self._recorded.headers)

    @property
    def other_requests(self) -> list[tuple[str, str, Any]]:
        with self._lock:
            return list(self._recorded.other)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def record_request(self, body: dict[str, Any], headers: dict[str, str]) -> None:
        with self._lock:
            self._recorded.requests.append(body)
            self._recorded.headers.append({k.lower(): v for k, v in headers.items()})

    def record_other(self, method: str, path: str, body: Any) -> None:
        with self._lock:
            self._recorded.other.append((method, path, body))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8090)
    args = parser.parse_args(argv)
    label = "fake OpenAI Responses API"
    fake = listen_or_exit(lambda: FakeResponses(args.host, args.port), args.host, args.port, label)
    serve_until_interrupted(fake, label)


if __name__ == "__main__":
    main()
