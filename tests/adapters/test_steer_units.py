"""The adapters' steer pieces without a runtime: Codex's turn/steer retry, the Claude turn's prompt
accounting, ACP's held follow-ups (the real runtimes: tests/kernel/test_steer.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import anyio
import pytest

from driver.adapters.acp.followup import FollowUps, blocks_of, deliver_all
from driver.adapters.claude.turn import prompts_answered
from driver.adapters.codex import steer as codex_steer
from driver.adapters.codex.turn import CodexTurn
from driver.adapters.common.base import SteerRefused
from driver.adapters.common.jsonrpc import JsonRpcError


class _Changes:
    """The adapter's `_turn_changed` event, renewed after each change."""

    def __init__(self) -> None:
        self.event = anyio.Event()

    def fire(self) -> None:
        self.event.set()
        self.event = anyio.Event()

    def current(self) -> anyio.Event:
        return self.event


def _turn(turn_id: str | None = "turn-1", active: bool = True) -> CodexTurn:
    turn = CodexTurn("run-1", "/tmp", "thr-1", turn_id=turn_id)
    turn.active = active
    return turn


async def test_codex_steer_names_the_active_turn() -> None:
    sent: list[tuple[str, dict[str, Any]]] = []

    async def call(method: str, params: dict[str, Any]) -> Any:
        sent.append((method, params))
        return {"turnId": params["expectedTurnId"]}

    items = [{"type": "text", "text": "also this"}]
    taken = await codex_steer.steer(call, _turn(), items, _Changes().current, anyio.Event())
    assert taken == "turn-1"
    assert sent == [("turn/steer", {"threadId": "thr-1", "input": items, "expectedTurnId": "turn-1"})]


async def test_codex_steer_retries_with_the_turn_id_codex_names_next() -> None:
    turn, changes = _turn("turn-stale"), _Changes()
    expected: list[str] = []

    async def call(method: str, params: dict[str, Any]) -> Any:
        expected.append(params["expectedTurnId"])
        if params["expectedTurnId"] == "turn-stale":
            # Refused; meanwhile Codex announces the turn it is really running.
            turn.turn_id = "turn-2"
            changes.fire()
            raise JsonRpcError(-32600, "expected turn turn-stale is not the active turn")
        return {"turnId": "turn-2"}

    with anyio.fail_after(5):
        taken = await codex_steer.steer(call, turn, [], changes.current, anyio.Event())
    assert expected == ["turn-stale", "turn-2"] and taken == "turn-2"


async def test_codex_steer_follows_the_active_turn_a_refusal_names() -> None:
    turn = _turn("turn-old")
    expected: list[str] = []

    async def call(method: str, params: dict[str, Any]) -> Any:
        expected.append(params["expectedTurnId"])
        if params["expectedTurnId"] == "turn-old":
            raise JsonRpcError(-32600, "expected active turn id `turn-old` but found `turn-new`")
        return {"turnId": "turn-new"}

    with anyio.fail_after(1):  # no wait for a notification: the refusal said which turn runs
        assert await codex_steer.steer(call, turn, [], _Changes().current, anyio.Event()) == "turn-new"
    assert expected == ["turn-old", "turn-new"] and turn.turn_id == "turn-new"


async def test_codex_steer_waits_for_the_turn_to_be_announced() -> None:
    turn, changes = _turn(None, active=False), _Changes()

    async def call(method: str, params: dict[str, Any]) -> Any:
        return {"turnId": params["expectedTurnId"]}

    async def announce() -> None:
        await anyio.sleep(0.05)  # the turn/started notification, a moment after the steer
        turn.turn_id, turn.active = "turn-9", True
        changes.fire()

    async with anyio.create_task_group() as tg:
        tg.start_soon(announce)
        with anyio.fail_after(5):
            assert await codex_steer.steer(call, turn, [], changes.current, anyio.Event()) == "turn-9"


@pytest.mark.parametrize(("ended", "cancelled", "code"), [(True, False, "run.not_active"), (False, True, "cancelled")])
async def test_codex_steer_is_refused_after_the_turn_or_a_cancel(ended: bool, cancelled: bool, code: str) -> None:
    turn = _turn()
    if ended:
        turn.handle("turn/completed", {"turn": {"id": "turn-1", "status": "completed"}})
    cancel = anyio.Event()
    if cancelled:
        cancel.set()

    async def call(method: str, params: dict[str, Any]) -> Any:
        raise AssertionError("nothing may be sent")

    with pytest.raises(SteerRefused) as refused:
        await codex_steer.steer(call, turn, [], _Changes().current, cancel)
    assert refused.value.code == code


async def test_codex_steer_gives_up_after_repeated_refusals() -> None:
    calls = 0

    async def call(method: str, params: dict[str, Any]) -> Any:
        nonlocal calls
        calls += 1
        raise JsonRpcError(-32600, "cannot steer this turn")

    changes = _Changes()
    codex_steer.RETRY_WAIT_S, saved = 0.01, codex_steer.RETRY_WAIT_S
    try:
        with pytest.raises(SteerRefused) as refused:
            await codex_steer.steer(call, _turn(), [], changes.current, anyio.Event())
    finally:
        codex_steer.RETRY_WAIT_S = saved
    assert calls == codex_steer.ATTEMPTS and refused.value.code == "run.not_active"


def _result(uuid: str | None, uuids: list[str] | None = None) -> Any:
    return SimpleNamespace(user_message_uuid=uuid, user_message_uuids=uuids)


def test_claude_turn_waits_for_the_result_of_every_prompt() -> None:
    pending = ["p-run", "p-steer"]
    assert prompts_answered(_result("p-run"), pending) == ["p-run"]  # one result; the steer's to come
    assert prompts_answered(_result(None, ["p-run", "p-steer"]), pending) == pending  # merged into one
    assert prompts_answered(_result("p-old"), pending) == []  # a late result of an earlier turn
    assert prompts_answered(_result(None), pending) == ["p-run"]  # a CLI that names none: the oldest


async def test_acp_follow_ups_are_delivered_together_or_refused() -> None:
    held = FollowUps()
    a, b = held.add([{"type": "text", "text": "a"}]), held.add([{"type": "text", "text": "b"}])
    batch = held.take()
    assert blocks_of(batch) == [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    deliver_all(batch)
    await a.wait()
    await b.wait()
    c = held.add([{"type": "text", "text": "c"}])
    held.close(SteerRefused("cancelled", "cancelled first"))
    with pytest.raises(SteerRefused):
        await c.wait()
    late = held.add([])  # after the run closed: refused at once, never held
    with pytest.raises(SteerRefused) as refused:
        await late.wait()
    assert refused.value.code == "cancelled" and held.take() == []
