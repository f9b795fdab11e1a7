"""The Claude Code CLI's control protocol, as values (no I/O).

Over the same stdio as the messages, each side can ask the other something:
- the driver asks the CLI (`control_request` with a `request_id` of ours, answered by a
  `control_response` naming it): `initialize` once after the start, `interrupt` to cancel a turn;
- the CLI asks the driver: `can_use_tool` (a permission prompt, answered allow or deny),
  `hook_callback` and `mcp_message` (hooks and in-process MCP servers, which the driver does not
  configure: answered with an error), and it may withdraw a question (`control_cancel_request`).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class PermissionAsk:
    """A `can_use_tool` request: what the CLI wants to run, and how it describes it."""

    tool_name: str
    tool_input: dict[str, Any]
    tool_use_id: str | None = None
    agent_id: str | None = None
    title: str | None = None
    display_name: str | None = None
    description: str | None = None
    suggestions: list[Any] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class PermissionAnswer:
    allow: bool
    updated_input: dict[str, Any] | None = None
    updated_permissions: list[Any] | None = None
    message: str = ""
    interrupt: bool = False


class BadControl(Exception):
    """A control frame whose shape is not the protocol's."""


def new_request_id() -> str:
    return f"req_{secrets.token_hex(6)}"


def request(request_id: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"type": "control_request", "request_id": request_id, "request": body}


def initialize(extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The initialize request's body: no hooks (the driver registers none), plus `extra` (agents)."""
    return {"subtype": "initialize", "hooks": None, **(extra or {})}


INTERRUPT: dict[str, Any] = {"subtype": "interrupt"}


def success(request_id: str, response: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "control_response",
        "response": {"subtype": "success", "request_id": request_id, "response": response},
    }


def error(request_id: str, message: str) -> dict[str, Any]:
    return {"type": "control_response", "response": {"subtype": "error", "request_id": request_id, "error": message}}


def _opt_str(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    return value if isinstance(value, str) else None


def permission_ask(body: dict[str, Any]) -> PermissionAsk:
    name, tool_input = body.get("tool_name"), body.get("input")
    if not isinstance(name, str) or not isinstance(tool_input, dict):
        raise BadControl("can_use_tool without a tool_name and an input object")
    suggestions = body.get("permission_suggestions")
    return PermissionAsk(
        tool_name=name,
        tool_input=tool_input,
        tool_use_id=_opt_str(body, "tool_use_id"),
        agent_id=_opt_str(body, "agent_id"),
        title=_opt_str(body, "title"),
        display_name=_opt_str(body, "display_name"),
        description=_opt_str(body, "description"),
        suggestions=list(suggestions) if isinstance(suggestions, list) else [],
    )


def permission_response(answer: PermissionAnswer, original_input: dict[str, Any]) -> dict[str, Any]:
    """The `can_use_tool` answer the CLI reads (`behavior`, `updatedInput`, ...)."""
    if answer.allow:
        out: dict[str, Any] = {
            "behavior": "allow",
            "updatedInput": answer.updated_input if answer.updated_input is not None else original_input,
        }
        if answer.updated_permissions:
            # "Allow for this session" means this session: a suggestion to write the rule into the
            # project's or the user's settings files is applied to the session only.
            updates = [u for u in answer.updated_permissions if isinstance(u, dict)]
            out["updatedPermissions"] = [{**u, "destination": "session"} for u in updates]
        return out
    out = {"behavior": "deny", "message": answer.message}
    if answer.interrupt:
        out["interrupt"] = True
    return out


@dataclass(frozen=True, slots=True)
class Reply:
    """The CLI's answer to one of our requests: its `response` body, or the error it gave."""

    request_id: str
    response: dict[str, Any] | None
    error: str | None


def reply_of(frame: dict[str, Any]) -> Reply:
    body = frame.get("response")
    if not isinstance(body, dict) or not isinstance(body.get("request_id"), str):
        raise BadControl("control_response without a request_id")
    if body.get("subtype") == "error":
        return Reply(body["request_id"], None, str(body.get("error") or "error"))
    response = body.get("response")
    return Reply(body["request_id"], response if isinstance(response, dict) else {}, None)
