"""What the driver says about itself (PROTOCOL §4.2, §4.4), built without I/O: the capabilities it
states, the `hello` that opens every connection and the `heartbeat` that follows.

The capabilities are static per runtime (driver/protocol/capabilities.py), so `hello` is built before the
adapter's module (and its SDK) is imported; `reattach` is stated only where it can work.
"""

from __future__ import annotations

import os
from typing import Any

from driver import __version__
from driver.protocol.boot import BootPayload
from driver.protocol.capabilities import ALL as CAPABILITIES
from driver.protocol.capabilities import capabilities_of, capability_mode
from driver.protocol.frames import (
    PROTOCOL_VERSION,
    Capability,
    Heartbeat,
    HeartbeatActivity,
    HeartbeatOutbox,
    HeartbeatProcess,
    Hello,
    OutboxSummary,
)
from driver.queue.outbox import utc_now
from driver.queue.outbox_types import OutboxStats


def stated_capabilities(boot: BootPayload) -> frozenset[str]:
    supported = capabilities_of(boot.execution.runtime)
    if "reattach" in supported and not _can_reattach(boot):
        supported = supported - {"reattach"}
    return supported


def _can_reattach(boot: BootPayload) -> bool:
    """PROTOCOL §8.2: reattach is off unless the boot payload gives a grace, and needs the PID
    namespace (only its pid 1, the keeper, ends every process of the tree: driver/keeper/kept.py)."""
    if boot.execution.reattach_grace_ms <= 0:
        return False
    from driver.keeper import kept

    return kept.supported()


def mode_of(runtime: str, supported: frozenset[str], capability: str) -> str | None:
    return capability_mode(runtime, capability) if capability in supported else None


def capability_entries(runtime: str, supported: frozenset[str]) -> list[dict[str, Any]]:
    """Every capability, as `driver.started` lists them: `{id, supported[, mode]}`."""
    out: list[dict[str, Any]] = []
    for c in CAPABILITIES:
        entry: dict[str, Any] = {"id": c, "supported": c in supported}
        if (mode := mode_of(runtime, supported, c)) is not None:
            entry["mode"] = mode
        out.append(entry)
    return out


def hello(
    boot: BootPayload,
    *,
    epoch: int,
    supported: frozenset[str],
    last_command_seq: int,
    stats: OutboxStats,
    started_at: str,
) -> Hello:
    runtime = boot.execution.runtime
    return Hello(
        protocol=PROTOCOL_VERSION,
        driver_instance_id=boot.driver_instance_id,
        epoch=epoch,
        driver_version=__version__,
        pid=os.getpid(),
        runtime=runtime,
        revision=boot.execution.revision,
        session_kind=boot.session.kind,
        capabilities=[Capability(c, c in supported, mode_of(runtime, supported, c)) for c in CAPABILITIES],
        last_command_seq=last_command_seq,
        outbox=OutboxSummary(stats.lossless_pending, stats.oldest_pending_seq),
        started_at=started_at,
    )


def heartbeat(
    state: str,
    *,
    run_id: str | None,
    stats: OutboxStats,
    activity: HeartbeatActivity | None,
    queued: list[str],
    processes: list[HeartbeatProcess],
) -> Heartbeat:
    return Heartbeat(
        at=utc_now(),
        state=state if state != "stopped" else "stopping",  # type: ignore[arg-type]
        run_id=run_id,
        outbox=HeartbeatOutbox(
            lossless_pending=stats.lossless_pending,
            best_effort_dropped=stats.best_effort_dropped,
            in_flight=stats.in_flight,
            oldest_pending_age_ms=stats.oldest_pending_age_ms,
            retries=stats.retries,
        ),
        activity=activity,
        queued=queued,
        processes=processes,
    )
