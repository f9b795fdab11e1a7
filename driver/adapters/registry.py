"""Runtime name → adapter class, imported lazily so the daemon never pays for an SDK it does not run."""

from __future__ import annotations

import importlib

from driver.adapters.base import Adapter

ADAPTERS: dict[str, str] = {
    "claude-agent-sdk": "driver.adapters.claude:ClaudeAdapter",
    "openai-app-server": "driver.adapters.codex:CodexAdapter",
    "acp": "driver.adapters.acp:AcpAdapter",
}


_STREAMS = frozenset({"text_stream", "thinking_stream", "tool_stream", "permission_request", "native_resume", "usage"})

# What each runtime's adapter declares, readable without importing it (the `hello` frame is built
# before any provider SDK is loaded). tests/adapters/test_registry.py keeps it equal to the classes'.
CAPABILITIES: dict[str, frozenset[str]] = {
    "claude-agent-sdk": _STREAMS | {"host_tools", "file_change"},
    "openai-app-server": _STREAMS | {"host_tools", "file_change"},
    "acp": _STREAMS | {"host_tools", "file_change", "session_state"},
}


def capabilities_of(runtime: str) -> frozenset[str]:
    return CAPABILITIES.get(runtime, frozenset())


def adapter_class(runtime: str) -> type[Adapter]:
    try:
        target = ADAPTERS[runtime]
    except KeyError:
        raise ValueError(f"unknown runtime {runtime!r} (known: {', '.join(ADAPTERS)})") from None
    module_name, _, attr = target.partition(":")
    cls: type[Adapter] = getattr(importlib.import_module(module_name), attr)
    return cls
