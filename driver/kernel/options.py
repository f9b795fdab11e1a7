"""The kernel's bounds (cancellation, stop, supervision, outbox), overridable from the environment."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import msgspec

from driver.kernel.supervision import (
    CRASH_LOOP_LIMIT,
    CRASH_LOOP_WINDOW_S,
    RESTART_BACKOFF_BASE_S,
    RESTART_BACKOFF_CAP_S,
    options_from_env,
)

CANCEL_INTERRUPT_GRACE_S = 5.0
CANCEL_TERM_GRACE_S = 3.0
STOP_DRAIN_TIMEOUT_S = 30.0
PROVIDER_START_TIMEOUT_S = 60.0
PROVIDER_STOP_TIMEOUT_S = 10.0
# A run whose provider tree neither emits nor uses more than 1% of a core for this long (while no
# permission or host tool call waits on the control plane) has a provider that stopped answering:
# run.failed provider.unresponsive (driver.telemetry.liveness).
PROVIDER_SILENCE_TIMEOUT_S = 600.0
# Overall deadlines of downloads (besides each read's timeout): one attachment of up to 256 MiB, one
# skill (its fetch and unpacking) of up to 64 MiB (driver.ports.fetch).
ATTACHMENT_TIMEOUT_S = 300.0
SKILL_TIMEOUT_S = 120.0


def project_root() -> Path:
    """Where `node_modules` with the pinned provider runtimes lives."""
    env = os.environ.get("AGENT_DRIVER_PROJECT_ROOT")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2]


class KernelOptions(msgspec.Struct, frozen=True):
    cancel_interrupt_grace_s: float = CANCEL_INTERRUPT_GRACE_S
    cancel_term_grace_s: float = CANCEL_TERM_GRACE_S
    stop_drain_timeout_s: float = STOP_DRAIN_TIMEOUT_S
    provider_start_timeout_s: float = PROVIDER_START_TIMEOUT_S
    provider_stop_timeout_s: float = PROVIDER_STOP_TIMEOUT_S
    provider_silence_timeout_s: float = PROVIDER_SILENCE_TIMEOUT_S  # 0: never
    restart_backoff_base_s: float = RESTART_BACKOFF_BASE_S
    restart_backoff_cap_s: float = RESTART_BACKOFF_CAP_S
    crash_loop_limit: int = CRASH_LOOP_LIMIT
    crash_loop_window_s: float = CRASH_LOOP_WINDOW_S
    outbox_max_events: int = 100_000  # PROTOCOL §4.1's default bound on unreceipted lossless events
    outbox_max_bytes: int = 256 * 1024 * 1024  # its other bound, on their encoded bytes (on disk)
    attachment_timeout_s: float = ATTACHMENT_TIMEOUT_S
    skill_timeout_s: float = SKILL_TIMEOUT_S

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> KernelOptions:
        """Defaults overridden by `AGENT_DRIVER_*` variables (driver.kernel.supervision.ENV_OPTIONS), so tests
        and operators can shorten the bounds of a real driver process from outside."""
        return cls(**options_from_env(environ))  # type: ignore[arg-type]
