"""The pieces of ACP reattach (PROTOCOL §8.2) without a process: the JSON-RPC peer's adopted answers
and replayed requests, what the input log says (the prompts sent, the answers given), the session
state carried in `turn.json`, and the events a permission answered by a predecessor derives again.
The whole path, with real agents and driver processes, is tests/kernel/test_reattach_acp.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest

from driver.adapters.acp import models as m
from driver.adapters.acp import reattach as acp_reattach
from driver.adapters.acp import state as acp_state
from driver.adapters.acp.turn import AcpTurn
from driver.adapters.common.jsonrpc import JsonRpcPeer
from driver.keeper import kept, reattach
from driver.keeper.state import Record, Turn, keeper_dir, replies, requests_since

# -- the peer ---------------------------------------------------------------------------------------


class Lines(anyio.abc.ByteReceiveStream):
    """The provider's output as re-read from the keeper's log: these lines, then the end."""

    def __init__(self, messages: list[dict[str, Any]], end: anyio.Event) -> None:
        self._data = b"".join(json.dumps(msg).encode() + b"\n" for msg in messages)
        self._end = end

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if not self._data:
            await self._end.wait()
            raise anyio.EndOfStream
        chunk, self._data = self._data[:7], self._data[7:]  # small chunks: lines cross them
        return chunk

    async def aclose(self) -> None:
        pass


class Written(anyio.abc.ByteSendStream):
    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []
        self.wrote = anyio.Event()

    async def send(self, item: bytes) -> None:
        self.lines.extend(json.loads(line) for line in item.splitlines())
        self.wrote.set()

    async def aclose(self) -> None:
        pass


async def test_the_peer_routes_an_adopted_answer_in_stream_order_and_skips_answered_requests() -> None:
    seen: list[str] = []
    written = Written()

    async def on_notification(method: str, params: Any) -> None:
        seen.append(f"note {params['n']}")

    async def on_request(method: str, params: Any) -> Any:
        seen.append(f"asked {method}")
        return {"ok": True}

    async def on_replayed(request_id: Any, method: str, params: Any) -> None:
        seen.append(f"replayed {request_id} {method}")

    async def on_answer(message: dict[str, Any]) -> None:
        seen.append(f"answer {message['result']['stopReason']}")

    output = [
        {"jsonrpc": "2.0", "method": "session/update", "params": {"n": 1}},
        {"jsonrpc": "2.0", "id": 0, "method": "session/request_permission", "params": {}},  # answered
        {"jsonrpc": "2.0", "method": "session/update", "params": {"n": 2}},
        {"jsonrpc": "2.0", "id": 3, "result": {}},  # a predecessor's request, not adopted: ignored
        {"jsonrpc": "2.0", "id": 1, "method": "fs/read_text_file", "params": {}},  # not answered
        {"jsonrpc": "2.0", "id": 5, "result": {"stopReason": "end_turn"}},  # the adopted prompt
        {"jsonrpc": "2.0", "method": "session/update", "params": {"n": 3}},
    ]
    end = anyio.Event()
    peer = JsonRpcPeer(
        Lines(output, end),
        written,
        name="t",
        jsonrpc_version="2.0",
        on_request=on_request,
        on_notification=on_notification,
        first_id=7,
        answered=frozenset({0}),
        on_replayed=on_replayed,
    )
    peer.adopt(5, on_answer)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(peer.run)
            await written.wrote.wait()  # the answer to the one request nobody answered
            end.set()
    assert [s for s in seen if not s.startswith("asked")] == [
        "note 1",
        "replayed 0 session/request_permission",
        "note 2",
        "answer end_turn",
        "note 3",
    ]
    assert peer.unknown_responses == 0
    # Only the request nobody answered was answered, once.
    assert [line.get("id") for line in written.lines] == [1]
    assert "asked fs/read_text_file" in seen


# -- the input log ----------------------------------------------------------------------------------


def write_in_log(state: Path, messages: list[dict[str, Any]]) -> list[int]:
    """The log, and the byte offset each message starts at."""
    folder = keeper_dir(state)
    folder.mkdir(parents=True, exist_ok=True)
    offsets, data = [], b""
    for msg in messages:
        offsets.append(len(data))
        data += json.dumps(msg).encode() + b"\n"
    (folder / "in.log").write_bytes(data)
    return offsets


def test_the_input_log_names_the_prompts_of_the_turn_and_the_answers_given(tmp_path: Path) -> None:
    offsets = write_in_log(
        tmp_path,
        [
            {"jsonrpc": "2.0", "id": 2, "method": "session/prompt", "params": {"sessionId": "s"}},  # an earlier run
            {"jsonrpc": "2.0", "id": 9, "result": {"outcome": {"outcome": "selected", "optionId": "a"}}},
            {"jsonrpc": "2.0", "id": 3, "method": "session/prompt", "params": {"sessionId": "s"}},
            {"jsonrpc": "2.0", "id": 10, "result": {"content": "a large file"}},
            {"jsonrpc": "2.0", "id": 11, "error": {"code": -32602, "message": "no"}},
            {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "s"}},
            {"jsonrpc": "2.0", "id": 4, "method": "session/prompt", "params": {"sessionId": "s"}},  # a follow-up
        ],
    )
    assert requests_since(tmp_path, offsets[1], "session/prompt") == [3, 4]
    assert requests_since(tmp_path, 0, "session/prompt") == [2, 3, 4]
    assert replies(tmp_path) == {9: {"outcome": {"outcome": "selected", "optionId": "a"}}, 10: {}, 11: None}
    assert requests_since(tmp_path / "none", 0, "session/prompt") == []


# -- what turn.json carries -------------------------------------------------------------------------


def test_session_state_survives_its_export() -> None:
    state = acp_state.SessionState()
    sent = state.feed({"sessionUpdate": "available_commands_update", "availableCommands": [{"name": "x"}]})
    assert len(sent) == 1
    restored = acp_state.SessionState.restore(json.loads(json.dumps(state.export())))
    # The same snapshot again is not sent again; a new one is.
    assert restored.feed({"sessionUpdate": "available_commands_update", "availableCommands": [{"name": "x"}]}) == []
    assert restored.feed({"sessionUpdate": "current_mode_update", "currentModeId": "ask"})
    assert acp_state.SessionState.restore("not a dict").export() == acp_state.SessionState().export()
    # An export is a copy: the state changing on does not change what was exported (turn.json's state0).
    saved = state.export()
    state.feed({"sessionUpdate": "available_commands_update", "availableCommands": [{"name": "y"}]})
    assert saved["sent"]["session.commands.updated"]["commands"][0]["name"] == "x"


AGENT = {"protocolVersion": 1, "agentCapabilities": {"promptCapabilities": {"image": True}}}


def plan_of(tmp_path: Path, run_id: str | None, extra: dict[str, Any]) -> reattach.Plan:
    turn = Turn("run-1", "ses-1", 100, 0, extra)
    record = Record(0, 0, 0, "00", "acp", "")
    return reattach.Plan(tmp_path, record, "ses-1", run_id, 100 if run_id else None, 7, frozenset(), turn=turn)


def test_a_continuation_takes_what_the_predecessor_marked(tmp_path: Path) -> None:
    write_in_log(tmp_path, [{"jsonrpc": "2.0", "id": 6, "method": "session/prompt", "params": {}}])
    state = acp_state.SessionState()
    state.feed({"sessionUpdate": "current_mode_update", "currentModeId": "ask"})
    extra = acp_reattach.facts(["agent", "--acp"], AGENT, 0.25, state, "be brief", [("user", "hi")])
    extra = json.loads(json.dumps(extra | {"state_sent": 2}))  # as read back from the file
    cont = acp_reattach.load(plan_of(tmp_path, "run-1", extra))
    assert cont is not None
    assert (cont.session_id, cont.run_id, cont.prompt_ids, cont.cost_before) == ("ses-1", "run-1", [6], 0.25)
    assert cont.argv == ["agent", "--acp"]
    assert cont.agent.agent_capabilities.prompt_capabilities.image is True
    # Sent with the run's first prompt: not pending any more. Two snapshots were reported since the mark.
    assert (cont.instructions, cont.recovery, cont.state_sent) == ("", [], 2)
    idle = acp_reattach.load(plan_of(tmp_path, None, extra))
    assert idle is not None
    assert (idle.instructions, idle.recovery, idle.state_sent, idle.prompt_ids) == ("be brief", [("user", "hi")], 0, [])


def test_a_continuation_needs_the_agent_s_initialize_answer(tmp_path: Path) -> None:
    assert acp_reattach.load(plan_of(tmp_path, "run-1", {})) is None
    assert acp_reattach.load(plan_of(tmp_path, "run-1", {"agent": {"protocolVersion": "x"}})) is None


# -- a permission answered by the predecessor -------------------------------------------------------


def request(kinds: list[str]) -> m.RequestPermissionParams:
    options = [{"optionId": f"o-{k}", "name": k, "kind": k} for k in kinds]
    raw = {"sessionId": "s", "toolCall": {"toolCallId": "call-1", "title": "Write"}, "options": options}
    return m.decode(raw, m.RequestPermissionParams)


def selected(option_id: str) -> dict[str, Any]:
    return {"outcome": {"outcome": "selected", "optionId": option_id}}


@pytest.mark.parametrize(
    ("reply", "full_access", "kinds"),
    [
        (selected("o-allow_once"), False, ["tool.started"]),
        (selected("o-reject_once"), False, ["tool.started", "tool.completed"]),
        ({"outcome": {"outcome": "cancelled"}}, False, ["tool.started"]),
        (None, False, ["tool.started"]),  # the predecessor's answer was an error
        (selected("o-reject_once"), True, ["tool.started"]),  # full_access never declines
    ],
)
def test_an_answered_permission_derives_what_answering_it_derived(
    reply: dict[str, Any] | None, full_access: bool, kinds: list[str]
) -> None:
    turn = AcpTurn("run-1")
    events = acp_reattach.replayed_permission(
        turn, request(["allow_once", "reject_once"]), reply, full_access=full_access
    )
    assert [kind for kind, _ in events] == kinds
    if "tool.completed" in kinds:
        assert events[-1][1]["status"] == "declined" and turn.declined


def test_kept_process_rewrites_its_turn_with_the_same_offsets(tmp_path: Path) -> None:
    keeper_dir(tmp_path).mkdir(parents=True)
    proc = object.__new__(kept.KeptProcess)  # only the turn's bookkeeping, no keeper
    proc.state_dir, proc.line_end, proc.in_size, proc.turn = tmp_path, 40, 12, None
    proc.mark_turn("run-1", "ses-1", {"state_sent": 0, "agent": AGENT})
    proc.line_end = proc.in_size = 999
    proc.update_turn({"state_sent": 3})
    turn = kept.read_turn(tmp_path)
    assert turn is not None
    assert (turn.run_id, turn.offset, turn.in_offset) == ("run-1", 40, 12)
    assert turn.extra == {"state_sent": 3, "agent": AGENT}
