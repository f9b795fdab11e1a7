"""A Claude Code permission prompt (`can_use_tool`) as the driver's permission request, and the port's
decision as the CLI's answer (PROTOCOL §6.2). No SDK import and no I/O: the adapter asks the port and
builds the SDK's result from the `Answer`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from driver.adapters.common.base import PermissionOption, PermissionRequest
from driver.interfaces import PermissionDecision

HOST_TOOL_PREFIX = "mcp__host__"  # how the CLI names the tools of the in-process `host` MCP server

PERMISSION_OPTIONS: tuple[PermissionOption, ...] = (
    PermissionOption("allow_once", "allow_once", "Allow once"),
    PermissionOption("allow_always", "allow_always", "Allow for this session"),
    PermissionOption("reject_once", "reject_once", "Reject"),
)


def asks(tool_name: str) -> bool:
    """Host tools run in the control plane, which decides about them itself: no local prompt."""
    return not tool_name.startswith(HOST_TOOL_PREFIX)


def request_of(
    tool_call_id: str,
    tool_name: str,
    tool_input: dict[str, Any],
    *,
    display_name: str | None,
    detail: str,
) -> PermissionRequest:
    """`detail`: what the CLI says about the call (its description or title), else our own line."""
    label = display_name or tool_name
    return PermissionRequest(
        tool_call_id=tool_call_id,
        title=f"{label}: {detail}" if detail and detail != label else label,
        options=PERMISSION_OPTIONS,
        tool_name=tool_name,
        tool_input=tool_input,
    )


@dataclass(frozen=True, slots=True)
class Answer:
    allow: bool
    updated_permissions: list[Any] | None = None  # the CLI's suggestions, kept for the session
    message: str = ""  # to the model, with a denial
    interrupt: bool = False  # a cancelled call ends the turn
    refused: Literal["cancelled", "declined"] | None = None  # how the tool call ends, for its tool.completed


def answer_of(decision: PermissionDecision, suggestions: list[Any] | None) -> Answer:
    if decision.allowed:
        updates = list(suggestions or []) if decision.option_kind == "allow_always" else None
        return Answer(True, updated_permissions=updates or None)
    if decision.outcome == "cancelled":
        return Answer(False, message="The tool call was cancelled.", interrupt=True, refused="cancelled")
    if decision.outcome == "timed_out":
        return Answer(False, message="No decision was made in time; the tool call was not run.", refused="declined")
    return Answer(False, message="The user declined this tool call.", refused="declined")
