"""The provider interface every adapter implements, and the ports it may use.

An adapter keeps its provider's native loop and maps it onto our events. It sees only ports:
`Ports.emit` for events (the kernel stamps ids, seq, epoch, session and run), `permissions`,
`host_tools` and `files`. It never writes a run terminal event itself: `run()` returns a
`TurnOutcome` and the kernel, which alone decides which terminal wins, emits it.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import anyio

from driver.interfaces import (
    EventPort,
    FilePort,
    HostToolPort,
    HostToolReply,
    PathNotAllowed,
    PermissionDecision,
    PermissionOption,
    PermissionOptionKind,
    PermissionPort,
    PermissionRequest,
    Ports,
)
from driver.protocol.boot import ExecutionConfig, SessionConfig
from driver.protocol.commands import RunInput

# Re-exported: adapters and their tests import the port types from here.
__all__ = [
    "Adapter",
    "AdapterConfig",
    "EventPort",
    "FilePort",
    "HostToolPort",
    "HostToolReply",
    "PathNotAllowed",
    "PermissionDecision",
    "PermissionOption",
    "PermissionOptionKind",
    "PermissionPort",
    "PermissionRequest",
    "Ports",
    "ProviderError",
    "SteerRefused",
    "TurnOutcome",
]


@dataclass(frozen=True, slots=True)
class AdapterConfig:
    """What an adapter is given at construction: the frozen execution snapshot and where to live."""

    session: SessionConfig
    execution: ExecutionConfig
    state_dir: Path  # a folder for this provider's home/config under session.state_dir
    project_root: Path  # where node_modules with the pinned runtimes lives
    traceparent: str | None = None
    # Environment for the provider process: allowlisted parent variables plus execution.environment.
    # Built by the kernel (`driver.adapters.common.environment.provider_env`); never contains the control token.
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TurnOutcome:
    """How a turn ended, as the provider reported it. The kernel turns it into the run terminal."""

    status: Literal["completed", "failed", "cancelled"]
    stop_reason: str = "end_turn"
    final_message_id: str | None = None
    final_message_text: str = ""
    usage: dict[str, Any] | None = None
    error_code: str | None = None
    error_message: str | None = None
    error_retryable: bool = False
    error_details: dict[str, Any] | None = None


class ProviderError(Exception):
    """A provider failure the kernel reports as `run.failed` with this code (e.g. `provider.crashed`)."""

    def __init__(self, code: str, message: str, *, retryable: bool = False, details: dict[str, Any] | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.retryable = retryable
        self.details = details or {}


class SteerRefused(Exception):
    """A steer the provider did not take (PROTOCOL §3.1): `run.not_active` (its turn is over), or
    `cancelled` (a cancel came first)."""

    def __init__(self, code: str, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retryable = retryable


class Adapter(abc.ABC):
    runtime: ClassVar[str]
    capabilities: ClassVar[frozenset[str]]

    def __init__(self, config: AdapterConfig, ports: Ports) -> None:
        self.config = config
        self.ports = ports

    @abc.abstractmethod
    async def start(self) -> None:
        """Spawn the provider and open (or resume) its native session. Emits
        `runtime.resume.updated` once the native id is known, `runtime.session.reset` on a failed resume."""

    @abc.abstractmethod
    async def run(self, run_id: str, run_input: RunInput) -> TurnOutcome:
        """Run one turn to its end, emitting events through the ports. Raise ProviderError on failure."""

    async def resume(self, run_id: str) -> TurnOutcome:
        """Continue the turn of `run_id` that a dead driver process left running under a keeper
        (PROTOCOL §8.2), to its end. The default: this adapter cannot, and says so."""
        raise ProviderError(
            "driver.restarted", "the driver process died while this run was active (no reattach)", retryable=True
        )

    @abc.abstractmethod
    async def cancel(self) -> None:
        """Ask the provider to interrupt the active turn (Codex turn/interrupt, Claude interrupt(),
        ACP session/cancel). Returns once asked; `run()` then returns a cancelled outcome."""

    async def steer(self, run_id: str, run_input: RunInput) -> None:
        """Add user input to the turn `run()` is running for `run_id` (PROTOCOL §3.1) and return once
        the provider has it: into the running turn, or (follow-up mode) as one more turn that `run()`
        runs before it returns. Raise SteerRefused when the turn is over or a cancel came first."""
        raise SteerRefused("steer.unsupported", f"the {self.runtime} runtime cannot be steered")

    @abc.abstractmethod
    async def reset(self) -> tuple[str | None, str | None]:
        """Discard the native session and start a fresh one; return (previous id, current id)."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Stop the provider process(es); idempotent; never raises for an already-dead provider."""

    def detach(self) -> bool:
        """Leave the provider running for a successor driver process (the handover, PROTOCOL §8.2):
        stop reading it without ending it. False (the default) when it is not kept by a keeper."""
        return False

    def process_group_ids(self) -> list[int]:
        """Process groups the kernel may SIGTERM/SIGKILL when an interrupt is not honoured in time."""
        return []

    async def wait_exited(self) -> None:
        """Return when the provider process that `start()` spawned has exited on its own.

        The kernel watches this between runs to notice a provider that died while idle and restart
        it. It must not return for a process replaced by `reset()` or ended by `stop()`. The default
        never returns (an adapter without a process to watch)."""
        await anyio.sleep_forever()

    def stderr_tail(self) -> str:
        """The last lines of the provider's stderr, already redacted (for failure diagnostics)."""
        return ""

    @property
    def native_id(self) -> str | None:
        """The provider-native thread or session id, when known."""
        return None
