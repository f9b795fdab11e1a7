"""The fake Responses endpoint, read back through the official `openai` client's SSE parser."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import openai
import pytest
from agent_lab.testing.fake_responses import FakeResponses
from agent_lab.testing.responses_plan import add_file_patch, plan_reply
from agent_lab.testing.script import DEFAULT_TEXT, ERROR_MESSAGE

PATCH_TOOL = {"type": "custom", "name": "apply_patch", "format": {"type": "text"}}
EXEC_TOOL = {"type": "function", "name": "exec_command", "parameters": {"type": "object"}}


def _user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def test_plan_keys_off_conversation_state() -> None:
    context = _user("<environment_context>cwd</environment_context>")
    assert plan_reply({"input": [context, _user("hi")]}).steps[0].text == DEFAULT_TEXT
    call = plan_reply({"input": [_user("[[shell:ls]]")]})
    assert (call.steps[0].type, call.steps[0].tool, call.steps[0].arg) == ("tool", "shell", "ls")
    output = {"type": "function_call_output", "call_id": "c", "output": "ok"}
    assert plan_reply({"input": [_user("[[shell:ls]]"), output]}).steps[0].text == "shell done"
    # A later plain prompt starts a new exchange even though an earlier tool output exists.
    later = plan_reply({"input": [_user("[[shell:ls]]"), output, _user("again")]})
    assert later.steps[0].text == DEFAULT_TEXT
    thought = plan_reply({"input": [_user("[[think]] [[say:yo]]")]})
    assert [s.type for s in thought.steps] == ["reasoning", "message"]
    assert plan_reply({"input": [_user("[[error]]")]}).error


def test_mcp_marker_searches_then_calls_then_reports() -> None:
    prompt = _user('[[mcp:host:lookup:{"id": 1}]]')
    first = plan_reply({"input": [prompt]}).steps[0]
    assert (first.tool, first.arg) == ("tool_search", "host lookup")
    namespace = {
        "type": "namespace",
        "name": "mcp__host",
        "tools": [{"type": "function", "name": "lookup", "parameters": {}}],
    }
    searched = {"type": "tool_search_output", "call_id": "s", "tools": [namespace]}
    second = plan_reply({"input": [prompt, searched]}).steps[0]
    assert second.tool == "function"
    assert json.loads(second.arg) == {"name": "lookup", "namespace": "mcp__host", "arguments": '{"id": 1}'}
    output = {"type": "function_call_output", "call_id": "c", "output": [{"type": "input_text", "text": "found"}]}
    assert plan_reply({"input": [prompt, searched, output]}).steps[0].text == "mcp done: found"


def test_add_file_patch() -> None:
    assert add_file_patch("a/b.txt", "x\ny") == "*** Begin Patch\n*** Add File: a/b.txt\n+x\n+y\n*** End Patch\n"


@pytest.fixture
def fake() -> Any:
    with FakeResponses() as f:
        yield f


def _client(fake: FakeResponses) -> openai.OpenAI:
    return openai.OpenAI(base_url=fake.base_url, api_key="sk-test", max_retries=0, timeout=10)


def test_text_stream_parses_with_openai_client(fake: FakeResponses) -> None:
    with _client(fake).responses.create(model="gpt-5.5", input="[[think]] [[say:Hi there]]", stream=True) as stream:
        events = list(stream)
    types = [e.type for e in events]
    assert types[0] == "response.created"
    assert types[-1] == "response.completed"
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == "Hi there"
    assert "response.reasoning_summary_text.delta" in types
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response  # type: ignore[union-attr]
    assert final.output_text == "Hi there"
    assert final.usage is not None and final.usage.output_tokens > 0
    assert fake.request_headers[0]["authorization"] == "Bearer sk-test"


def test_tool_calls_follow_the_offered_tools(fake: FakeResponses) -> None:
    client = _client(fake)
    with client.responses.create(
        model="gpt-5.5",
        input="[[write:a.txt:hey]]",
        tools=[PATCH_TOOL, EXEC_TOOL],
        stream=True,  # type: ignore[list-item]
    ) as stream:
        done = [e.item for e in stream if e.type == "response.output_item.done"]
    assert done[0].type == "custom_tool_call"
    assert done[0].input == add_file_patch("a.txt", "hey")
    with client.responses.create(
        model="gpt-5.5",
        input="[[shell:echo hi]]",
        tools=[EXEC_TOOL],
        stream=True,  # type: ignore[list-item]
    ) as stream:
        done = [e.item for e in stream if e.type == "response.output_item.done"]
    assert done[0].type == "function_call"
    assert (done[0].name, done[0].arguments) == ("exec_command", '{"cmd": "echo hi"}')


def test_error_marker_is_http_500(fake: FakeResponses) -> None:
    with pytest.raises(openai.InternalServerError) as info:
        _client(fake).responses.create(model="gpt-5.5", input="[[error]]", stream=True)
    assert ERROR_MESSAGE in str(info.value)


def test_models_and_other_paths_are_recorded(fake: FakeResponses) -> None:
    with urllib.request.urlopen(fake.base_url + "/models", timeout=5) as answer:
        assert json.load(answer)["data"][0]["id"] == "gpt-5.5"
    post = urllib.request.Request(fake.base_url + "/chat/completions", data=b"{}", method="POST")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(post, timeout=5)
    assert info.value.code == 404
    assert [(m, p) for m, p, _ in fake.other_requests] == [("GET", "/v1/models"), ("POST", "/v1/chat/completions")]
