"""Boot payloads that run each REAL runtime offline against the fake model endpoints, for the real
driver process (the same settings the adapter tests use: tests/adapters/test_{claude,codex,acp}.py).

Used by the provider-marked kernel tests (the benches carry the same settings in
lab/agent_lab/bench/_driven.py, on the evidence rig).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from agent_lab.testing import codex_acp
from agent_lab.testing.fakes import Fakes

from tests.integration.harness import INSTANCE, ROOT, STUBBORN, TOKEN

RUNTIMES = ("claude-agent-sdk", "openai-app-server", "acp:codex-acp")
CODEX_ACP = ROOT / "node_modules" / "@zed-industries" / "codex-acp-linux-x64" / "bin" / "codex-acp"

# Prompts that make each runtime's fake model stream for ~20 s, and ask for a permission.
SLOW = "[[slow]]"
PERMISSION = {
    "claude-agent-sdk": "[[write:notes.txt:hello]]",
    "openai-app-server": "[[shell:touch notes.txt]]",
    "acp:codex-acp": "[[write:notes.txt:hello]]",
    "acp:stubborn": "[[perm]]",
}


def payload(runtime: str, tmp: Path, url: str, fakes: Fakes, *, mode: str = "normal") -> dict[str, Any]:
    """A boot payload for `runtime` (one of RUNTIMES, or "acp:stubborn") with state under `tmp`."""
    cwd, state = tmp / "cwd", tmp / "state"
    cwd.mkdir(parents=True, exist_ok=True)
    execution: dict[str, Any] = {
        "revision": "rev-k",
        "permission_policy": "supervised",
        "permission_timeout_ms": 60_000,
    }
    if runtime == "claude-agent-sdk":
        execution |= {
            "runtime": runtime,
            "model": "claude-sonnet-4-5",
            "environment": {
                "ANTHROPIC_BASE_URL": fakes.anthropic.base_url,
                "ANTHROPIC_API_KEY": "sk-ant-fake-0123456789",
            },
        }
    elif runtime == "openai-app-server":
        execution |= {
            "runtime": runtime,
            "model": "gpt-5.5",
            "environment": {"OPENAI_API_KEY": "sk-fake-openai-0123456789"},
            "provider_options": {"base_url": fakes.responses.base_url, "env_key": "OPENAI_API_KEY"},
        }
    elif runtime == "acp:codex-acp":
        home = codex_acp.write_home(state / "codex-acp-home", fakes.responses.base_url, "FAKE_OPENAI_API_KEY")
        # codex-acp refuses to install its sandbox helper under the temporary directory.
        (state / "tmp").mkdir(exist_ok=True)
        execution |= {
            "runtime": "acp",
            "environment": {"FAKE_OPENAI_API_KEY": "sk-fake-openai-0123456789"},
            "acp": {"command": [str(CODEX_ACP)], "env": {"CODEX_HOME": str(home), "TMPDIR": str(state / "tmp")}},
        }
    elif runtime == "acp:stubborn":
        execution |= {"runtime": "acp", "acp": {"command": [sys.executable, str(STUBBORN), mode]}}
    else:
        raise ValueError(runtime)
    return {
        "protocol": 1,
        "driver_instance_id": INSTANCE,
        "control": {"url": url, "token": TOKEN},
        "session": {
            "id": "ses-k",
            "agent_id": "agt-k",
            "kind": "cattle",
            "cwd": str(cwd),
            "state_dir": str(state),
            "idle_exit_ms": None,
        },
        "execution": execution,
    }
