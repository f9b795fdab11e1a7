"""The kernel: one driver instance's states, commands, runs, provider and life, in rooms of their own.

`core.Kernel` wires them: `commands` (dispatch, idempotency, statuses as facts), `runpath` (input.start
to the terminal, cancellation; `reports` measures what a run leaves behind, `escalation` is a cancel's
ladder), `provider` (adapters, the current native session, the transcript, session.reset), `lifecycle`
(restart recovery, idle exit, stop).
"""

from driver.kernel.core import Kernel
from driver.kernel.options import KernelOptions, project_root

__all__ = ["Kernel", "KernelOptions", "project_root"]
