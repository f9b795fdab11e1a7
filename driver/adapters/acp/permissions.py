"""`session/request_permission` on the client side: ACP options to our PermissionRequest and our
decision back to an ACP outcome. Pure functions.

Options are matched by `kind`, never by id or position: agents use their own ids ("approved",
"allow-once", ...) and order. A decision that names an option we offered keeps it; otherwise the
first offered option of a fitting kind is chosen. No fitting option means the answer is `cancelled`,
the one outcome every agent must accept.
"""

from __future__ import annotations

from typing import Any, cast

from driver.adapters.acp import models as m
from driver.adapters.common.base import PermissionDecision, PermissionOption, PermissionOptionKind, PermissionRequest

ALLOW_KINDS: tuple[str, ...] = ("allow_once", "allow_always")
REJECT_KINDS: tuple[str, ...] = ("reject_once", "reject_always")
OPTION_KINDS: frozenset[str] = frozenset(ALLOW_KINDS + REJECT_KINDS)
CANCELLED: dict[str, Any] = {"outcome": {"outcome": "cancelled"}}


def offered(options: list[m.PermissionOption]) -> list[m.PermissionOption]:
    """The options we can represent (an unknown kind cannot be chosen by kind, so it is dropped)."""
    return [o for o in options if o.kind in OPTION_KINDS]


def to_request(call: m.ToolCall, options: list[m.PermissionOption]) -> PermissionRequest:
    return PermissionRequest(
        tool_call_id=call.tool_call_id,
        title=call.title or call.kind or "permission requested",
        options=tuple(PermissionOption(o.option_id, cast(PermissionOptionKind, o.kind), o.name) for o in options),
        tool_name=call.name or call.kind or "",
        tool_input=call.raw_input,
    )


def pick(options: list[m.PermissionOption], kinds: tuple[str, ...]) -> m.PermissionOption | None:
    """The first option of the first kind in `kinds` that is offered."""
    for kind in kinds:
        for option in options:
            if option.kind == kind:
                return option
    return None


def selected(option: m.PermissionOption | None) -> dict[str, Any]:
    if option is None:
        return CANCELLED
    return {"outcome": {"outcome": "selected", "optionId": option.option_id}}


def answer(options: list[m.PermissionOption], decision: PermissionDecision) -> tuple[dict[str, Any], bool]:
    """The ACP outcome for `decision`, and whether it rejects the tool call.

    `timed_out` is a rejection (PROTOCOL §6.2); `cancelled` is ACP's cancelled outcome."""
    if decision.outcome == "cancelled":
        return CANCELLED, False
    kinds = ALLOW_KINDS if decision.outcome == "allowed" else REJECT_KINDS
    chosen = next((o for o in options if o.option_id == decision.option_id and o.kind in kinds), None)
    if chosen is None:
        preferred: tuple[str, ...] = kinds
        if decision.option_kind in kinds:
            preferred = (decision.option_kind, *kinds)
        chosen = pick(options, preferred)
    return selected(chosen), decision.outcome != "allowed"
