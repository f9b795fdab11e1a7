"""Codex's session-level notices as `diagnostic.reported` payloads (no I/O).

Warnings about configuration, deprecations, a rerouted model or an MCP server that failed to start are
not part of any turn (they may arrive between turns) and are not failures: the control plane sees them
as diagnostics, with Codex's own wording.
"""

from __future__ import annotations

from typing import Any

NOTICES: frozenset[str] = frozenset(
    {
        "warning",
        "guardianWarning",
        "deprecationNotice",
        "configWarning",
        "model/rerouted",
        "mcpServer/startupStatus/updated",
    }
)


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def diagnostic(method: str, params: Any) -> dict[str, Any] | None:
    """The diagnostic payload for a notice (`method` in NOTICES), or None when there is nothing to say."""
    if not isinstance(params, dict):
        return None
    if method in ("warning", "guardianWarning"):
        message, code = _str(params.get("message")), "provider.warning"
    elif method in ("deprecationNotice", "configWarning"):
        details = _str(params.get("details"))
        summary = _str(params.get("summary"))
        message = f"{summary} ({details})" if details else summary
        code = "provider.config" if method == "configWarning" else "provider.deprecation"
    elif method == "model/rerouted":
        reason = params.get("reason")
        message = f"model rerouted from {_str(params.get('fromModel'))} to {_str(params.get('toModel'))}"
        message += f" ({reason})" if isinstance(reason, str) else ""
        code = "provider.model_rerouted"
    elif method == "mcpServer/startupStatus/updated":
        if params.get("status") != "failed":
            return None  # starting / ready / cancelled: normal life
        error = _str(params.get("error"))
        message = f"mcp server {_str(params.get('name'))!r} failed to start" + (f": {error}" if error else "")
        code = "provider.mcp_failed"
    else:
        return None
    if not message:
        return None
    return {"code": code, "severity": "warning", "message": message, "details": {"codex_method": method}}
