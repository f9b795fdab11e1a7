"""Containment (PROTOCOL §9, docs/supervision.md): what keeps the provider tree from outliving the driver,
from seeing the driver's state, and from reading the driver's memory. The one face other packages import:

- `wrapper`: the launch prefix a provider starts under (pid namespace, subreaper or parent-death
  signal), its process groups, and the degraded features the control plane is told about;
- `record`: the record of the processes the driver started, so a successor ends what a crash left;
- `hiding`: the mount plan that covers `state_dir/driver/` and the lock in the provider's namespace;
- `statelock`: one driver process per state_dir (the lock and its verified holder);
- `undumpable`: the driver's memory kept from a same-uid reader;
- `subreaper.py`: a stdlib-only script the fallback prefix runs (`python -I`), never imported.

Modules of this package import each other directly (never this face), so that importing one of them
does not depend on the face being complete.
"""

from __future__ import annotations

from driver.containment import statelock
from driver.containment.hiding import private_paths
from driver.containment.record import (
    RECORD_NAME,
    ProcessRecord,
    ended,
    reap,
    report,
    start_time,
    started,
    take_findings,
    track,
)
from driver.containment.statelock import LOCK_NAME
from driver.containment.undumpable import make_undumpable
from driver.containment.wrapper import (
    ENV_MODE,
    MODES,
    degraded_feature,
    exit_status,
    hide,
    kill_group,
    mode_of,
    pdeathsig_prefix,
    pidns_prefix,
    prefix,
    state_visible,
    subreaper_prefix,
    take_degraded,
    wrap,
    wrap_async,
)

__all__ = [
    "ENV_MODE",
    "LOCK_NAME",
    "MODES",
    "RECORD_NAME",
    "ProcessRecord",
    "degraded_feature",
    "ended",
    "exit_status",
    "hide",
    "kill_group",
    "make_undumpable",
    "mode_of",
    "pdeathsig_prefix",
    "pidns_prefix",
    "prefix",
    "private_paths",
    "reap",
    "report",
    "start_time",
    "started",
    "state_visible",
    "statelock",
    "subreaper_prefix",
    "take_degraded",
    "take_findings",
    "track",
    "wrap",
    "wrap_async",
]
