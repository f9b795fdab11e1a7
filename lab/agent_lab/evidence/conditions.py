"""The conditions a report was measured under: machine, Python, provider versions, model endpoints."""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import platform
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _memory_mb() -> int | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    return None


def _npm_version(root: Path, package: str) -> str | None:
    with contextlib.suppress(OSError, ValueError):
        return str(json.loads((root / "node_modules" / package / "package.json").read_text())["version"])
    return None


def runtime_versions(root: Path, runtimes: Iterable[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for runtime in runtimes:
        if runtime == "claude-agent-sdk":
            with contextlib.suppress(importlib.metadata.PackageNotFoundError):
                out[runtime] = importlib.metadata.version("claude-agent-sdk") + " (bundled Claude Code CLI)"
        elif runtime == "openai-app-server":
            out[runtime] = f"codex app-server {_npm_version(root, '@openai/codex') or '?'}"
        elif runtime == "acp":
            out[runtime] = f"codex-acp {_npm_version(root, '@zed-industries/codex-acp') or '?'}"
    return out


def collect(root: Path, runtimes: Iterable[str], quick: bool, runs: int) -> dict[str, Any]:
    runtimes = list(runtimes)
    return {
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "uid": os.getuid(),
        "cpu": _cpu_model(),
        "cpus": os.cpu_count(),
        "memory_mb": _memory_mb(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "runtimes": runtime_versions(root, runtimes),
        "model": "fake model endpoints from lab/agent_lab/testing/ (fake_anthropic, fake_responses) on loopback; "
        "provider API keys in the environment are not used",
        "control_plane": "reference control plane (lab/agent_lab/controlplane/), SQLite store, loopback ws://",
        "mode": "quick" if quick else "full",
        "runs": runs,
        "workload": "scripted prompts: [[say]], [[slow]] (400 chunks x 50 ms), [[shell]], flood ACP agent",
    }
