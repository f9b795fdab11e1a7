"""Codex `turn/steer` (PROTOCOL §3.1, mode `native`): user input into the running turn.

Codex takes it only for the turn it names as active (`expectedTurnId`), and only once it announced
that turn (`turn/started`); a steer sent with an id that is not (or no longer) the active one is
refused. So: wait until the turn is announced, send with its current id; on a refusal that names the
active turn ("expected active turn id `A` but found `B`") follow that turn and send again at once,
on any other refusal wait for Codex's next word about the turn and send again with the id known then.
Codex keeps the input with the turn and gives it to the model in the turn's next request (the one
after the response now streaming, or after the tool call now running).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from driver import logs
from driver.adapters.codex.turn import CodexTurn
from driver.adapters.common.base import SteerRefused
from driver.adapters.common.jsonrpc import JsonRpcError

log = logs.get(__name__)

ATTEMPTS = 5
ANNOUNCE_WAIT_S = 15.0  # how long a steer waits for Codex to announce the turn
RETRY_WAIT_S = 1.0  # after a refusal: until Codex's next word about the turn, at most this
# Codex's refusal of a stale id names the turn it runs now: "expected active turn id `A` but found `B`".
_FOUND = re.compile(r"but found `([^`]+)`")


async def _until(turn: CodexTurn, changed: Callable[[], anyio.Event], cancelled: anyio.Event, seconds: float) -> None:
    """Wait until the turn is announced or over, or a cancel is asked (bounded)."""
    with anyio.move_on_after(seconds):
        while not turn.active and turn.end is None and not cancelled.is_set():
            await changed().wait()


async def steer(
    call: Callable[[str, dict[str, Any]], Awaitable[Any]],
    turn: CodexTurn,
    items: list[dict[str, Any]],
    changed: Callable[[], anyio.Event],
    cancelled: anyio.Event,
) -> str:
    """Deliver `items` into `turn`; return the turn id Codex took them for."""
    for attempt in range(ATTEMPTS):
        await _until(turn, changed, cancelled, ANNOUNCE_WAIT_S)
        if cancelled.is_set():
            raise SteerRefused("cancelled", "the run was cancelled before the input reached codex")
        if turn.end is not None:
            raise SteerRefused("run.not_active", "the codex turn ended before the input reached it")
        if turn.turn_id is None or not turn.active:
            raise SteerRefused("run.not_active", "codex did not announce the turn", retryable=True)
        expected = turn.turn_id
        params = {"threadId": turn.thread_id, "input": items, "expectedTurnId": expected}
        try:
            result = await call("turn/steer", params)
        except JsonRpcError as exc:
            log.warning("codex.steer_refused", attempt=attempt + 1, turn_id=expected, error=exc.message)
            found = _FOUND.search(exc.message)
            if found is not None and found.group(1) != expected and turn.end is None:
                # The thread's active turn moved on (one thread runs one turn at a time: it is this
                # run's): follow it, and send again with its id at once.
                turn.turn_id = found.group(1)
                continue
            waiting = changed()
            with anyio.move_on_after(RETRY_WAIT_S):
                await waiting.wait()
            continue
        taken = result.get("turnId") if isinstance(result, dict) else None
        return taken if isinstance(taken, str) else expected
    raise SteerRefused("run.not_active", f"codex refused turn/steer {ATTEMPTS} times", retryable=True)
