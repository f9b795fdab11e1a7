"""How a Codex turn ends, as the adapter's `TurnOutcome` (no I/O): from its `turn/completed`, or from
Codex refusing `turn/start`. A cancel asked during the turn makes any end but `completed` a cancel."""

from __future__ import annotations

from typing import Any

from driver.adapters.codex.turn import CodexTurn
from driver.adapters.common.base import TurnOutcome
from driver.adapters.common.jsonrpc import JsonRpcError


def turn_outcome(turn: CodexTurn, *, cancel_requested: bool) -> TurnOutcome:
    assert turn.end is not None
    common: dict[str, Any] = {
        "final_message_id": turn.final_message_id,
        "final_message_text": turn.final_message_text,
        "usage": turn.usage_payload,
    }
    if turn.end.status == "interrupted" or (cancel_requested and turn.end.status != "completed"):
        return TurnOutcome(status="cancelled", stop_reason="cancelled", **common)
    if turn.end.status == "failed":
        return TurnOutcome(
            status="failed",
            stop_reason="error",
            error_code="provider.error",
            error_message=turn.end.error_message or "codex reported the turn as failed",
            error_details={"codex_error": turn.end.error_info} if turn.end.error_info else None,
            **common,
        )
    return TurnOutcome(status="completed", stop_reason="end_turn", **common)


def refused_outcome(failure: JsonRpcError, *, cancel_requested: bool) -> TurnOutcome:
    return TurnOutcome(
        status="cancelled" if cancel_requested else "failed",
        stop_reason="cancelled" if cancel_requested else "error",
        error_code="provider.error",
        error_message=f"codex refused turn/start: {failure.message}",
        error_details={"code": failure.code},
    )
