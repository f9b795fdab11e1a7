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
    "reattach",  # PROTOCOL §8.2: a run in flight survives its driver (with execution.reattach_grace_ms)
)

_STREAMS = frozenset({"text_stream", "thinking_stream", "tool_stream", "permission_request", "native_resume", "usage"})

BY_RUNTIME: dict[str, frozenset[str]] = {
    "claude-agent-sdk": _STREAMS | {"host_tools", "file_change"},
    "openai-app-server": _STREAMS | {"host_tools", "file_change", "reattach"},
    "acp": _STREAMS | {"host_tools", "file_change", "session_state"},
}


def capabilities_of(runtime: str) -> frozenset[str]:
    return BY_RUNTIME.get(runtime, frozenset())
