"""What every part of `agent-driver dev` shares: its constants, its error, and where things live."""

from __future__ import annotations

import secrets
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

READY_TIMEOUT_S = 120.0  # the provider may take a while on a cold machine (Claude's CLI is 200 MB)
STOP_TIMEOUT_S = 45.0  # session.stop drains the outbox; after this the driver is terminated
KILL_GRACE_S = 5.0
HEARTBEAT_MS = 1000  # frequent, so /status shows fresh outbox counts
PERMISSION_TIMEOUT_MS = 15 * 60 * 1000  # a person answers these, not a program
RUN_TERMINALS = frozenset({"run.completed", "run.failed", "run.cancelled"})
AGENT_PREFIX = "agent> "
THINKING_PREFIX = "thinking> "
USER_PROMPT = "you> "
CONSOLE_PREFIX = "console> "  # input typed in the web console
# Credentials the driver process itself never needs: they reach the provider through the boot payload.
PROVIDER_SECRETS = frozenset({"ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "OPENAI_API_KEY", "CODEX_API_KEY"})
OFFLINE_MARKERS = "try [[say:TEXT]], [[shell:CMD]], [[write:PATH:TEXT]], [[think]], or [[slow]] then Ctrl-C"
HELP = (
    "Type a message and press Enter; a line typed during a reply steers it, /queue TEXT runs TEXT after it."
    " /status shows the link; /shell opens a terminal in the web console; /link prints a fresh console login"
    " link (each works once); /quit or Ctrl-D leaves;"
    " Ctrl-C cancels a reply."
)
SHELL_COLS, SHELL_ROWS = 120, 30  # /shell's terminal until the console fits it to its pane

Action = tuple[str, Any]  # (kind, value): what the chat loop reacts to, from stdin, signals and the pump


class DevError(Exception):
    """A problem worth one clear line (and exit status 1), not a traceback."""


# --------------------------------------------------------------------------------------------------
# Where things live


@dataclass(frozen=True)
class DevPaths:
    workdir: Path
    instance_id: str

    @property
    def db(self) -> Path:
        return self.workdir / "controlplane.sqlite3"

    @property
    def workspace(self) -> Path:
        return self.workdir / "workspace"

    @property
    def memory(self) -> Path:
        return self.workdir / "memory"

    @property
    def session_dir(self) -> Path:
        return self.workdir / "sessions" / self.instance_id

    @property
    def state_dir(self) -> Path:
        return self.session_dir / "state"

    @property
    def boot_file(self) -> Path:
        return self.session_dir / "boot.json"

    @property
    def driver_log(self) -> Path:
        return self.session_dir / "driver.log"

    @property
    def cp_log(self) -> Path:
        return self.session_dir / "controlplane.log"

    def create(self) -> None:
        for folder in (self.workspace, self.memory):
            folder.mkdir(parents=True, exist_ok=True)
        # The session dir briefly holds the boot file (with the control token): owner only.
        self.session_dir.mkdir(parents=True, mode=0o700)
        self.state_dir.mkdir(mode=0o700)


def new_command_id() -> str:
    return f"cmd-dev-{uuid.uuid4().hex[:16]}"


def new_instance_id() -> str:
    """Unique per dev run, so every run starts at epoch 1 with a state dir of its own."""
    return f"drv-dev-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(2)}"
