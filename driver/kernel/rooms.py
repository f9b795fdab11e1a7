"""The second half of a kernel's construction: its ports, rooms, supervisor and telemetry room.

Imported by `Kernel.assemble`, after the first `hello` went out when the kernel is served: these
imports (the rooms, the ports, the adapters' base types, the supervisor, telemetry) are most of what
a driver loads before its provider, and none of them is needed to say `hello`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from driver.adapters.common.base import Ports
from driver.checkpoints.recorder import Checkpointer
from driver.kernel.commands import CommandDesk
from driver.kernel.lifecycle import Lifecycle
from driver.kernel.provider import ProviderRoom
from driver.kernel.runpath import RunPath
from driver.kernel.supervision import CrashWindow
from driver.kernel.supervisor import ProviderSupervisor
from driver.ports.files import AllowedRoots, driver_private
from driver.ports.host_tools import HostToolBroker
from driver.ports.permissions import PermissionBroker
from driver.processes.room import ProcessRoom
from driver.telemetry.room import TelemetryRoom

if TYPE_CHECKING:
    from driver.kernel.core import Kernel


def assemble(k: Kernel) -> None:
    boot, ex = k.boot, k.boot.execution
    k.permissions = PermissionBroker(
        k.emit,
        policy=ex.permission_policy,
        timeout_ms=ex.permission_timeout_ms,
        id_prefix=f"prm-{k.epoch}",
        on_pending_change=k.permission_pending_changed,
        durable=k.outbox.flush,
    )
    k.host_tools = HostToolBroker(
        k.emit,
        id_prefix=f"htc-{k.epoch}",
        current_run=lambda: k.run.run_id if k.run else None,
        known={t.name for t in ex.host_tools},
        timeout_s=ex.host_tool_timeout_ms / 1000.0,
    )
    roots = [boot.session.memory_dir, *boot.session.additional_directories]
    k.files = AllowedRoots(boot.session.cwd, roots, private=driver_private(boot.session.state_dir))
    k.ports = Ports(k, k.permissions, k.host_tools, k.files)
    k.commands = CommandDesk(k)
    k.runs = RunPath(k)
    k.provider = ProviderRoom(k)
    k.checkpoints = Checkpointer(k)
    k.lifecycle = Lifecycle(k)
    k.telemetry = TelemetryRoom(k)
    k.processes = ProcessRoom(k)
    opts = k.options
    k.supervisor = ProviderSupervisor(
        k.provider.new_adapter,
        k.emit,
        start_timeout_s=opts.provider_start_timeout_s,
        stop_timeout_s=opts.provider_stop_timeout_s,
        crashes=CrashWindow(
            limit=opts.crash_loop_limit,
            window_s=opts.crash_loop_window_s,
            backoff_base_s=opts.restart_backoff_base_s,
            backoff_cap_s=opts.restart_backoff_cap_s,
        ),
        on_ready=k.provider_ready,
        on_lost=lambda: k.fire("provider_lost"),
        on_exited=k.provider.provider_exited,
        on_starting=k.telemetry.provider_starting,
        on_started=k.telemetry.provider_started,
        notes=k.provider.take_notes,
    )
