"""The Claude Code CLI's stream-json messages, read into small typed values (no I/O, no SDK import).

The CLI (`--output-format stream-json --input-format stream-json`) writes one JSON object per line.
This module reads the ones a turn is made of into the values the translator (claude_turn.py) works
on, under the names the Claude Agent SDK gives them (its `message_parser` is the reference for the
field names; docs/providers.md's coverage table lists every kind). Why our own reader rather than the
SDK's: importing `claude_agent_sdk` costs the driver process 43 MB and 0.7 s (it pulls the `mcp`
SDK's pydantic models), for a wire this small; the SDK still ships the CLI the driver runs, pinned.

Control frames (`control_request`, `control_response`, `control_cancel_request`) are the client's
(claude_control.py) and never reach here; a kind this module does not know is returned as None,
and a known kind with a wrong shape raises `BadMessage` naming what is missing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class BadMessage(Exception):
    """A CLI message of a known type whose shape is not what the CLI documents."""


@dataclass(frozen=True, slots=True)
class TextBlock:
    text: str


@dataclass(frozen=True, slots=True)
class ThinkingBlock:
    thinking: str
    signature: str = ""


@dataclass(frozen=True, slots=True)
class ToolUseBlock:
    id: str
    name: str
    input: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ToolResultBlock:
    tool_use_id: str
    content: Any = None
    is_error: bool | None = None


Block = TextBlock | ThinkingBlock | ToolUseBlock | ToolResultBlock


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """A raw Anthropic API stream event (`--include-partial-messages`)."""

    event: dict[str, Any]
    parent_tool_use_id: str | None = None
    session_id: str | None = None


@dataclass(frozen=True, slots=True)
class AssistantMessage:
    content: list[Block]
    model: str = ""
    parent_tool_use_id: str | None = None
    error: Any = None  # set on the synthetic message the CLI writes for a failed API call
    message_id: str | None = None
    session_id: str | None = None


@dataclass(frozen=True, slots=True)
class UserMessage:
    content: str | list[Block]
    parent_tool_use_id: str | None = None
    uuid: str | None = None


@dataclass(frozen=True, slots=True)
class SystemMessage:
    subtype: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ResultMessage:
    subtype: str
    is_error: bool
    session_id: str | None = None
    stop_reason: str | None = None
    total_cost_usd: float | None = None
    usage: dict[str, Any] | None = None
    result: str | None = None
    errors: list[str] | None = None
    api_error_status: int | None = None
    terminal_reason: str | None = None
    user_message_uuid: str | None = None
    user_message_uuids: list[str] | None = None


Message = StreamEvent | AssistantMessage | UserMessage | SystemMessage | ResultMessage


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _blocks(raw: Any, where: str) -> list[Block]:
    if not isinstance(raw, list):
        raise BadMessage(f"{where}: content is not a list")
    out: list[Block] = []
    for block in raw:
        if not isinstance(block, dict):
            raise BadMessage(f"{where}: a content block is not an object")
        kind = block.get("type")
        try:
            if kind == "text":
                out.append(TextBlock(str(block["text"])))
            elif kind == "thinking":
                out.append(ThinkingBlock(str(block["thinking"]), str(block.get("signature") or "")))
            elif kind == "tool_use":
                tool_input = block.get("input")
                out.append(
                    ToolUseBlock(
                        str(block["id"]), str(block["name"]), tool_input if isinstance(tool_input, dict) else {}
                    )
                )
            elif kind == "tool_result":
                is_error = block.get("is_error")
                out.append(
                    ToolResultBlock(
                        str(block["tool_use_id"]),
                        block.get("content"),
                        is_error if isinstance(is_error, bool) else None,
                    )
                )
            # Other blocks (server tool use, images, redacted thinking) carry nothing the driver reports.
        except KeyError as exc:
            raise BadMessage(f"{where}: a {kind} block has no {exc.args[0]!r}") from None
    return out


def _message(data: dict[str, Any], where: str) -> dict[str, Any]:
    message = data.get("message")
    if not isinstance(message, dict):
        raise BadMessage(f"{where}: no message object")
    return message


def parse(data: dict[str, Any]) -> Message | None:
    """The typed value of one CLI message, None for a kind the driver does not read."""
    kind = data.get("type")
    if kind == "stream_event":
        event = data.get("event")
        if not isinstance(event, dict):
            raise BadMessage("stream_event: no event object")
        return StreamEvent(event, _str(data.get("parent_tool_use_id")), _str(data.get("session_id")))
    if kind == "assistant":
        message = _message(data, "assistant")
        return AssistantMessage(
            content=_blocks(message.get("content"), "assistant"),
            model=str(message.get("model") or ""),
            parent_tool_use_id=_str(data.get("parent_tool_use_id")),
            error=data.get("error"),
            message_id=_str(message.get("id")),
            session_id=_str(data.get("session_id")),
        )
    if kind == "user":
        message = _message(data, "user")
        content = message.get("content")
        return UserMessage(
            content=content if isinstance(content, str) else _blocks(content, "user"),
            parent_tool_use_id=_str(data.get("parent_tool_use_id")),
            uuid=_str(data.get("uuid")),
        )
    if kind == "system":
        subtype = data.get("subtype")
        if not isinstance(subtype, str):
            raise BadMessage("system: no subtype")
        return SystemMessage(subtype, data)
    if kind == "result":
        subtype, is_error = data.get("subtype"), data.get("is_error")
        if not isinstance(subtype, str) or not isinstance(is_error, bool):
            raise BadMessage("result: no subtype or is_error")
        cost, status = data.get("total_cost_usd"), data.get("api_error_status")
        errors, uuids, usage = data.get("errors"), data.get("user_message_uuids"), data.get("usage")
        return ResultMessage(
            subtype=subtype,
            is_error=is_error,
            session_id=_str(data.get("session_id")),
            stop_reason=_str(data.get("stop_reason")),
            total_cost_usd=float(cost) if isinstance(cost, int | float) and not isinstance(cost, bool) else None,
            usage=usage if isinstance(usage, dict) else None,
            result=_str(data.get("result")),
            errors=[str(e) for e in errors] if isinstance(errors, list) else None,
            api_error_status=status if isinstance(status, int) and not isinstance(status, bool) else None,
            terminal_reason=_str(data.get("terminal_reason")),
            user_message_uuid=_str(data.get("user_message_uuid")),
            user_message_uuids=[u for u in uuids if isinstance(u, str)] if isinstance(uuids, list) else None,
        )
    return None  # rate limits, conversation resets and any newer kind: nothing the driver reports
