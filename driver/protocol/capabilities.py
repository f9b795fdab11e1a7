"""Capability ids (PROTOCOL `hello.capabilities`) and what each runtime's adapter declares.

A module of its own, below the adapters: the `hello` frame is built from it before any adapter (or
provider SDK) is imported. tests/adapters/test_registry.py keeps the table equal to the classes'.
"""

from __future__ import annotations

# Capability ids a provider may declare, in the order `hello` lists them.
ALL: tuple[str, ...] = (
    "text_stream",
    "thinking_stream",
    "tool_stream",
    "permission_request",
    "native_resume",
    "usage",
    "host_tools",
    "file_change",
    "session_state",  # session.mode.updated / session.config.updated / session.commands.updated
    "steer",  # input.steer (PROTOCOL §3.1); its mode is STEER_MODE's
    "reattach",  # PROTOCOL §8.2: a run in flight survives its driver (with execution.reattach_grace_ms)
)

_STREAMS = frozenset(
    {"text_stream", "thinking_stream", "tool_stream", "permission_request", "native_resume", "usage", "steer"}
)

BY_RUNTIME: dict[str, frozenset[str]] = {
    "claude-agent-sdk": _STREAMS | {"host_tools", "file_change"},
    "openai-app-server": _STREAMS | {"host_tools", "file_change", "reattach"},
    "acp": _STREAMS | {"host_tools", "file_change", "session_state", "reattach"},
}


# How each runtime takes `input.steer` (PROTOCOL §3.1): into the running turn (Codex `turn/steer`, the
# Claude Agent SDK's streaming input), or as one more turn once the current one ends (ACP v1 has no
# way into a running prompt).
STEER_MODE: dict[str, str] = {
    "claude-agent-sdk": "native",
    "openai-app-server": "native",
    "acp": "follow_up",
}


def capability_mode(runtime: str, capability: str) -> str | None:
    """The mode a capability declares in `hello` (only `steer` has one)."""
    return STEER_MODE.get(runtime) if capability == "steer" else None


def capabilities_of(runtime: str) -> frozenset[str]:
    return BY_RUNTIME.get(runtime, frozenset())
