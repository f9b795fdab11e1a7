"""How a Claude turn ends, as the adapter's `TurnOutcome` (no I/O): from the turn's `ResultMessage`.
A cancel asked during the turn (or a result the CLI marks aborted) makes it a cancel."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from driver.adapters.claude.turn import TurnTranslator
from driver.adapters.common.base import TurnOutcome


def cost_share(total: float, last_total: float) -> float:
    """Claude Code reports the session's running total; a run's usage is its own share. A total below
    the last one means the CLI started counting again (a new process)."""
    return round(total - last_total if total >= last_total else total, 9)


def turn_outcome(
    result: Any,
    translator: TurnTranslator,
    usage: dict[str, Any],
    *,
    cancelling: bool,
    redact: Callable[[str], str],
) -> TurnOutcome:
    common: dict[str, Any] = {
        "final_message_id": translator.final_message_id,
        "final_message_text": translator.final_message_text,
        "usage": usage,
    }
    aborted = str(result.terminal_reason or "").startswith("aborted")
    if cancelling or aborted:
        return TurnOutcome(status="cancelled", stop_reason="cancelled", **common)
    if result.is_error:
        text = "; ".join(result.errors or []) or (result.result or "").strip()
        text = text or "; ".join(translator.error_texts) or result.subtype
        status = result.api_error_status
        return TurnOutcome(
            status="failed",
            stop_reason="error",
            error_code="provider.model_error" if status else "provider.error",
            error_message=redact(text),
            error_retryable=bool(status) and (status >= 500 or status == 429),
            error_details={"subtype": result.subtype, "api_error_status": status},
            **common,
        )
    return TurnOutcome(status="completed", stop_reason=result.stop_reason or "end_turn", **common)
