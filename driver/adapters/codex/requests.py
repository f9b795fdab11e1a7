"""Codex's approval requests (server → client) as permission requests, and our decisions as Codex's
answers (no I/O). Every approval request in the app-server schema goes through the permission port:

- `item/commandExecution/requestApproval`, `item/fileChange/requestApproval` (v2): `{decision}` of
  `accept` / `acceptForSession` / `decline` / `cancel`;
- `item/permissions/requestApproval` (v2, extra sandbox permissions): `{permissions, scope}`, granting
  what was asked for the turn or the session, or nothing;
- `execCommandApproval`, `applyPatchApproval` (v1, still in the schema): `{decision}` of `approved` /
  `approved_for_session` / `denied` / `abort`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from driver.adapters.common.base import PermissionDecision, PermissionOption, PermissionRequest

APPROVALS: frozenset[str] = frozenset(
    {
        "item/commandExecution/requestApproval",
        "item/fileChange/requestApproval",
        "item/permissions/requestApproval",
        "execCommandApproval",
        "applyPatchApproval",
    }
)

_V1 = frozenset({"execCommandApproval", "applyPatchApproval"})


def _options(session_label: str, *, always: bool = True) -> tuple[PermissionOption, ...]:
    options = [PermissionOption("accept", "allow_once", "Allow once")]
    if always:
        options.append(PermissionOption("acceptForSession", "allow_always", session_label))
    options.append(PermissionOption("decline", "reject_once", "Decline"))
    return tuple(options)


def permission_request(
    method: str, params: dict[str, Any], change_paths: Callable[[str], list[str]]
) -> PermissionRequest:
    """Our permission request for an approval request (`method` in APPROVALS). `change_paths` gives
    the paths of an in-flight file change item (the v2 file approval does not repeat them)."""
    reason = params.get("reason")
    if method == "item/commandExecution/requestApproval":
        offered = params.get("availableDecisions")
        # Offer "always" only where Codex lists it (a command prompt may not).
        always = not isinstance(offered, list) or "acceptForSession" in offered
        command = str(params.get("command") or "")
        return PermissionRequest(
            tool_call_id=str(params.get("itemId") or ""),
            title=f"Run: {command}" if command else "Run a command",
            options=_options("Allow for this session", always=always),
            tool_name="shell",
            tool_input={"command": command, "cwd": params.get("cwd"), "reason": reason},
        )
    if method == "item/fileChange/requestApproval":
        item_id = str(params.get("itemId") or "")
        paths = change_paths(item_id)
        return PermissionRequest(
            tool_call_id=item_id,
            title="Edit " + ", ".join(paths) if paths else "Apply file changes",
            options=_options("Allow for this session"),
            tool_name="apply_patch",
            tool_input={"changes": paths, "reason": reason, "grant_root": params.get("grantRoot")},
        )
    if method == "item/permissions/requestApproval":
        asked = params.get("permissions") or {}
        return PermissionRequest(
            tool_call_id=str(params.get("itemId") or ""),
            title=f"Grant extra permissions: {reason}" if reason else "Grant extra sandbox permissions",
            options=_options("Grant for this session"),
            tool_name="permissions",
            tool_input={"permissions": asked, "cwd": params.get("cwd"), "reason": reason},
        )
    if method == "execCommandApproval":
        command = " ".join(str(part) for part in params.get("command") or [])
        return PermissionRequest(
            tool_call_id=str(params.get("callId") or ""),
            title=f"Run: {command}" if command else "Run a command",
            options=_options("Allow for this session"),
            tool_name="shell",
            tool_input={"command": command, "cwd": params.get("cwd"), "reason": reason},
        )
    changes = params.get("fileChanges")
    paths = sorted(changes) if isinstance(changes, dict) else []
    return PermissionRequest(
        tool_call_id=str(params.get("callId") or ""),
        title="Edit " + ", ".join(paths) if paths else "Apply file changes",
        options=_options("Allow for this session"),
        tool_name="apply_patch",
        tool_input={"changes": paths, "reason": reason, "grant_root": params.get("grantRoot")},
    )


def answer(method: str, params: dict[str, Any], decision: PermissionDecision) -> dict[str, Any]:
    """Codex's answer to an approval request, from our decision."""
    allowed = decision.outcome == "allowed"
    always = allowed and decision.option_kind == "allow_always"
    if method == "item/permissions/requestApproval":
        granted = params.get("permissions") if allowed else {}
        return {"permissions": granted or {}, "scope": "session" if always else "turn"}
    if method in _V1:
        if allowed:
            return {"decision": "approved_for_session" if always else "approved"}
        return {"decision": "abort" if decision.outcome == "cancelled" else "denied"}
    if allowed:
        return {"decision": "acceptForSession" if always else "accept"}
    if decision.outcome == "cancelled":
        return {"decision": "cancel"}  # the run is being cancelled: Codex also interrupts the turn
    return {"decision": "decline"}  # rejected, or timed out: the turn goes on without the tool


def elicitation_request(
    params: dict[str, Any], running_tool: Callable[[str], str | None] | None
) -> PermissionRequest | None:
    """Codex asks before an MCP tool call with a form elicitation marked `mcp_tool_call`; that is a
    permission request. Any other elicitation (a server wanting user input) is declined (None): no one
    here can fill in a form."""
    meta = params.get("_meta")
    if not isinstance(meta, dict) or meta.get("codex_approval_kind") != "mcp_tool_call":
        return None
    name = f"{params.get('serverName') or ''}.{meta.get('tool_name') or ''}"
    # The elicitation names no item: the call it is about is the running MCP call of that tool.
    tool_call_id = (running_tool(name) if running_tool is not None else None) or f"mcp:{name}"
    return PermissionRequest(
        tool_call_id=tool_call_id,
        title=str(params.get("message") or f"Allow {name}?"),
        options=(
            PermissionOption("accept", "allow_once", "Allow once"),
            PermissionOption("decline", "reject_once", "Decline"),
        ),
        tool_name=name,
        tool_input=meta.get("tool_params"),
    )


def elicitation_action(decision: PermissionDecision) -> dict[str, Any]:
    if decision.outcome == "allowed":
        return {"action": "accept", "content": {}}
    return {"action": "cancel" if decision.outcome == "cancelled" else "decline"}
