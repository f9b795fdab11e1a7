"""The fake Anthropic endpoint on its own: script selection and wire framing, over real HTTP."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from agent_lab.testing.fake_anthropic import DEFAULT_TEXT, ERROR_MESSAGE, FakeAnthropic, plan_reply


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as server:
        yield server


def _post(fake: FakeAnthropic, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
    request = urllib.request.Request(
        fake.base_url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _sse(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for chunk in raw.decode().split("\n\n"):
        if not chunk.strip():
            continue
        lines = dict(line.split(": ", 1) for line in chunk.splitlines())
        events.append((lines["event"], json.loads(lines["data"])))
    return events


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def test_plain_stream_is_framed_like_the_real_api(fake: FakeAnthropic) -> None:
    status, raw = _post(fake, "/v1/messages", {"model": "m", "stream": True, "messages": [_user("hi")]})
    assert status == 200
    events = _sse(raw)
    names = [name for name, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    text = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta")
    assert text == DEFAULT_TEXT
    assert names.count("content_block_delta") > 1  # several chunks, not one
    delta = next(d for n, d in events if n == "message_delta")
    assert delta["delta"]["stop_reason"] == "end_turn" and delta["usage"]["output_tokens"] > 0
    assert fake.requests[-1]["messages"][0]["content"][0]["text"] == "hi"


def test_non_streaming_request_gets_one_message(fake: FakeAnthropic) -> None:
    status, raw = _post(fake, "/v1/messages", {"model": "m", "messages": [_user("[[say:plain json]]")]})
    body = json.loads(raw)
    assert status == 200
    assert body["content"] == [{"type": "text", "text": "plain json"}]
    assert body["usage"]["input_tokens"] > 0


def test_error_marker_answers_500_with_the_scripted_message(fake: FakeAnthropic) -> None:
    status, raw = _post(fake, "/v1/messages", {"model": "m", "stream": True, "messages": [_user("x [[error]]")]})
    assert status == 500
    assert json.loads(raw) == {"type": "error", "error": {"type": "api_error", "message": ERROR_MESSAGE}}


def test_tool_call_then_done_keys_off_the_tool_result() -> None:
    first = {"messages": [_user("please [[write:a/b.txt:hi there]]")]}
    reply = plan_reply(first)
    assert reply.stop_reason == "tool_use"
    assert reply.blocks[0].tool_name == "Write"
    assert reply.blocks[0].tool_input == {"file_path": "a/b.txt", "content": "hi there"}
    answered = {
        "messages": [
            *first["messages"],
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Write", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]},
        ]
    }
    assert [b.text for b in plan_reply(answered).blocks] == ["write done"]
    shell = plan_reply({"messages": [_user("[[shell:touch x]]")]})
    assert shell.blocks[0].tool_name == "Bash" and shell.blocks[0].tool_input["command"] == "touch x"


def test_tool_use_streams_its_input_as_json_deltas(fake: FakeAnthropic) -> None:
    status, raw = _post(fake, "/v1/messages", {"model": "m", "stream": True, "messages": [_user("[[shell:ls -la]]")]})
    assert status == 200
    events = _sse(raw)
    start = next(d for n, d in events if n == "content_block_start")
    assert start["content_block"]["type"] == "tool_use" and start["content_block"]["name"] == "Bash"
    partial = "".join(d["delta"]["partial_json"] for n, d in events if n == "content_block_delta")
    assert json.loads(partial)["command"] == "ls -la"
    assert next(d for n, d in events if n == "message_delta")["delta"]["stop_reason"] == "tool_use"


def test_think_marker_streams_a_thinking_block_first(fake: FakeAnthropic) -> None:
    _, raw = _post(fake, "/v1/messages", {"model": "m", "stream": True, "messages": [_user("[[think]] [[say:ok]]")]})
    starts = [d["content_block"]["type"] for n, d in _sse(raw) if n == "content_block_start"]
    assert starts == ["thinking", "text"]


def test_other_endpoints_are_recorded(fake: FakeAnthropic) -> None:
    status, raw = _post(fake, "/v1/messages/count_tokens", {"model": "m", "messages": [_user("hi")]})
    assert status == 200 and json.loads(raw)["input_tokens"] > 0
    status, _ = _post(fake, "/v1/unknown", {})
    assert status == 404
    assert [(m, p) for m, p, _ in fake.other_requests][-2:] == [
        ("POST", "/v1/messages/count_tokens"),
        ("POST", "/v1/unknown"),
    ]


def test_in_a_merged_user_message_the_newest_instruction_wins() -> None:
    # Claude Code merges a prompt that was interrupted before it ran into the next user message.
    merged = {
        "role": "user",
        "content": [{"type": "text", "text": "[[say:old]]"}, {"type": "text", "text": "[[say:new]]"}],
    }
    assert [b.text for b in plan_reply({"messages": [merged]}).blocks] == ["new"]
