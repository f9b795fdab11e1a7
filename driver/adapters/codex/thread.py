"""Which Codex thread a session opens, and how (no I/O).

At start the adapter resumes the thread it had before a restart, else the boot payload's (PROTOCOL
§8: `native_resume`), else starts one. A boot-payload thread that cannot be resumed (or another
runtime's session id, which Codex cannot resume at all) is replaced by a fresh thread, reported by
`runtime.session.reset`, and the recovery messages are replayed as context on the next turn; our own
earlier thread needs no replay of them (they are older than it).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from driver.adapters.codex.config import CodexSettings
from driver.adapters.common.base import ProviderError
from driver.protocol.boot import NativeResume, RecoveryMessage

RUNTIME = "openai-app-server"

Recovery = list[tuple[str, str]]  # (role, text) of each message to replay


@dataclass(frozen=True, slots=True)
class Opening:
    resume: str | None  # the thread to try `thread/resume` on, else None: start one
    recovery: bool = False  # `resume` came from the boot payload: its failure keeps the recovery replay
    foreign: NativeResume | None = None  # another runtime's session: replaced, never resumed


def opening(own: str | None, boot: NativeResume | None) -> Opening:
    if own is not None or boot is None:
        return Opening(own)
    if boot.runtime != RUNTIME:
        return Opening(None, foreign=boot)
    return Opening(boot.value, recovery=True)


def thread_params(settings: CodexSettings, cwd: Path, developer_instructions: str) -> dict[str, Any]:
    params: dict[str, Any] = {
        "cwd": str(cwd),
        "model": settings.model,
        "approvalPolicy": settings.approval_policy,
        "sandbox": settings.sandbox,
        # The execution's prompt and the driver's paragraph ride as developer instructions (Codex keeps
        # its own base instructions); skills are in CODEX_HOME/skills, which Codex lists itself.
        "developerInstructions": developer_instructions,
    }
    if settings.config_overrides:
        params["config"] = settings.config_overrides
    return params


def thread_of(result: Any) -> str:
    """The thread id of a `thread/start` or `thread/resume` answer."""
    thread = result.get("thread") if isinstance(result, dict) else None
    thread_id = thread.get("id") if isinstance(thread, dict) else None
    if not isinstance(thread_id, str):
        raise ProviderError("provider.protocol", "codex answered without a thread id")
    return thread_id


def recovery_of(messages: Iterable[RecoveryMessage]) -> Recovery:
    return [(m.role, m.text) for m in messages]


def with_recovery(text: str, pending: Recovery) -> str:
    """The next turn's text, after the history a fresh thread replaces (PROTOCOL §8)."""
    if not pending:
        return text
    lines = ["Context: the earlier conversation of this session could not be resumed. Here it is:"]
    lines += [f"{role}: {said}" for role, said in pending]
    return "\n".join(lines) + "\n\n" + text
