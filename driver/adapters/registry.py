"""Runtime name → adapter class, imported lazily so the daemon never pays for an SDK it does not run."""

from __future__ import annotations

import importlib

from driver.adapters.common.base import Adapter

ADAPTERS: dict[str, str] = {
    "claude-agent-sdk": "driver.adapters.claude.adapter:ClaudeAdapter",
    "openai-app-server": "driver.adapters.codex.adapter:CodexAdapter",
    "acp": "driver.adapters.acp.adapter:AcpAdapter",
}


def adapter_class(runtime: str) -> type[Adapter]:
    try:
        target = ADAPTERS[runtime]
    except KeyError:
        raise ValueError(f"unknown runtime {runtime!r} (known: {', '.join(ADAPTERS)})") from None
    module_name, _, attr = target.partition(":")
    cls: type[Adapter] = getattr(importlib.import_module(module_name), attr)
    return cls
