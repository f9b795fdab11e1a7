"""One ACP turn's prompt and outcome, without I/O: the content blocks of session/prompt (pending
instructions, the recovery history, the text, the attachments) and the TurnOutcome a stop reason means."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from driver import logs
from driver.adapters.acp import models as m
from driver.adapters.acp import session as acp_session
from driver.adapters.acp.turn import AcpTurn
from driver.adapters.common import attachments
from driver.adapters.common.base import ProviderError, TurnOutcome
from driver.protocol.commands import RunInput

log = logs.get(__name__)

FAILED_STOP_REASONS: frozenset[str] = frozenset({"max_tokens", "max_turn_requests", "refusal"})


def outcome(turn: AcpTurn, stop: str) -> TurnOutcome:
    common: dict[str, Any] = {
        "final_message_id": turn.final_message_id,
        "final_message_text": turn.final_message_text,
        "usage": turn.usage,
    }
    if stop == "cancelled":
        return TurnOutcome(status="cancelled", stop_reason="cancelled", **common)
    if stop in FAILED_STOP_REASONS:
        return TurnOutcome(
            status="failed",
            stop_reason=stop,
            error_code=stop,
            error_message=f"the agent stopped the turn: {stop}",
            **common,
        )
    if stop not in ("end_turn", "permission_rejected"):
        log.warning("acp.unknown_stop_reason", stop_reason=stop)
    return TurnOutcome(status="completed", stop_reason=stop, **common)


def prompt_blocks(
    run_input: RunInput,
    *,
    cwd: Path,
    agent: m.InitializeResult,
    instructions: str,
    recovery: list[tuple[str, str]],
) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if instructions:
        blocks.append({"type": "text", "text": f"<instructions>\n{instructions}\n</instructions>"})
    if recovery:
        lines = [
            "Context: the earlier conversation of this session could not be resumed natively. "
            "Here it is, for reference:"
        ]
        lines.extend(f"{role}: {text}" for role, text in recovery)
        blocks.append({"type": "text", "text": "\n".join(lines)})
    blocks.append({"type": "text", "text": run_input.text})
    try:
        blocks.extend(acp_session.attachment_blocks(cwd, run_input.attachments, agent))
    except (attachments.AttachmentRefused, OSError) as exc:
        raise ProviderError("command.invalid", str(exc)) from None
    return blocks
