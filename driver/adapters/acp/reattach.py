"""ACP agents across a driver restart (PROTOCOL §8.2, docs/protocol.md's keeper section): what an ACP
adapter leaves in the keeper's `turn.json` for a successor, and what the successor rebuilds from it and
from the keeper's input log. No I/O beyond reading those files (`load` blocks: call it from a thread).

A successor does not send `initialize` or `session/new`: the agent is initialized and its session is
open. So the predecessor writes, with each mark (`facts`): the `initialize` answer (the agent's
capabilities, which shape prompts and follow-ups), the session's cumulative cost before the turn (a
run reports its own share of it), the session state it had reported (mode, options, commands: the
`SessionState` snapshots, so none is sent twice), and the instructions or recovery history still
waiting for a first prompt. From the input log the successor takes the `session/prompt` requests the
predecessor wrote for the run in flight (their answers end its turns: the peer adopts those ids) and
the predecessor's answers to the agent's requests (a permission answered is re-derived, not asked again).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import anyio
import msgspec

from driver.adapters.acp import models as m
from driver.adapters.acp import permissions as acp_permissions
from driver.adapters.acp.state import SessionState
from driver.adapters.acp.turn import AcpTurn, Emit
from driver.adapters.common.base import ProviderError, TurnOutcome
from driver.keeper import reattach
from driver.keeper.state import replies, requests_since

PROMPT = "session/prompt"


def facts(
    argv: list[str],
    agent: Any,
    cost_total: float,
    state: SessionState,
    instructions: str,
    recovery: list[tuple[str, str]],
) -> dict[str, Any]:
    """The `extra` of a mark: all JSON values."""
    return {
        "argv": argv,  # a successor configured with another agent command does not attach to this one
        "agent": agent,
        "cost_before": cost_total,
        "state0": state.export(),  # the session state as the turn began: a replay starts from it
        "state": state.export(),  # the latest reported (rewritten as it changes: an idle successor starts from it)
        "state_sent": 0,  # state snapshots reported since the mark, over every driver process
        "instructions": instructions,
        "recovery": [list(r) for r in recovery],
    }


@dataclass
class Continuation:
    """What a successor knows of the session it attached to, and of the run it continues."""

    session_id: str
    agent: m.InitializeResult
    agent_raw: Any
    cost_before: float
    state: SessionState
    state_sent: int
    instructions: str
    recovery: list[tuple[str, str]]
    run_id: str | None  # the run to continue, else None (attached while idle)
    argv: list[str] | None = None  # the agent command the predecessor ran
    prompt_ids: list[int] = field(default_factory=list)
    replies: dict[Any, dict[str, Any] | None] = field(default_factory=dict)
    # Set by the last adopted prompt's answer: how the predecessor's last prompt ended.
    done: anyio.Event = field(default_factory=anyio.Event)
    stop: str | None = None
    outcome: TurnOutcome | None = None  # set instead of `stop` when that prompt was refused
    error: ProviderError | None = None  # set instead when its answer could not be read


def load(plan: reattach.Plan) -> Continuation | None:
    """The continuation a plan allows, or None when the predecessor left no usable ACP facts."""
    turn = plan.turn
    if turn is None or plan.thread_id is None:
        return None
    extra = turn.extra
    try:
        agent = m.decode(extra.get("agent"), m.InitializeResult)
    except (msgspec.ValidationError, TypeError):
        return None
    continuing = plan.run_id is not None
    recovery_raw = extra.get("recovery")
    recovery = [
        (str(r[0]), str(r[1]))
        for r in (recovery_raw if isinstance(recovery_raw, list) else [])
        if isinstance(r, list) and len(r) == 2
    ]
    cost = extra.get("cost_before")
    sent = extra.get("state_sent")
    instructions = extra.get("instructions")
    cont = Continuation(
        session_id=plan.thread_id,
        agent=agent,
        agent_raw=extra.get("agent"),
        cost_before=float(cost) if isinstance(cost, int | float) and not isinstance(cost, bool) else 0.0,
        # A replay re-derives the turn's state updates from the state the turn began with; an idle
        # successor reads nothing again and starts from the latest.
        state=SessionState.restore(extra.get("state0" if continuing else "state")),
        state_sent=sent if isinstance(sent, int) and not isinstance(sent, bool) and continuing else 0,
        # What was pending at a run's mark went with its first prompt; an idle session keeps it.
        instructions=instructions if isinstance(instructions, str) and not continuing else "",
        recovery=recovery if not continuing else [],
        run_id=plan.run_id,
        argv=[str(a) for a in extra["argv"]] if isinstance(extra.get("argv"), list) else None,
    )
    if continuing:
        cont.prompt_ids = requests_since(plan.state_dir, turn.in_offset, PROMPT)
    cont.replies = replies(plan.state_dir)
    return cont


def replayed_permission(
    turn: AcpTurn, req: m.RequestPermissionParams, reply: dict[str, Any] | None, *, full_access: bool
) -> list[Emit]:
    """What the predecessor's `_request_permission` derived for a request it answered (`reply`, from
    the input log): the tool announced, and declined when the answer selected a reject option."""
    events = turn.announce_tool(req.tool_call)
    outcome = reply.get("outcome") if reply is not None and not full_access else None
    if not isinstance(outcome, dict) or outcome.get("outcome") != "selected":
        return events
    chosen = next((o for o in req.options if o.option_id == outcome.get("optionId")), None)
    if chosen is not None and chosen.kind in acp_permissions.REJECT_KINDS:
        events += turn.decline_tool(req.tool_call.tool_call_id)
    return events
