"""The kernel: one driver instance's states, commands, runs, provider and life, in rooms of their own.

`core.Kernel` wires them: `commands` (dispatch, idempotency, statuses as facts), `runpath` (input.start
to the terminal, cancellation; `reports` measures what a run leaves behind, `escalation` is a cancel's
ladder), `provider` (adapters, the current native session, the transcript, session.reset), `lifecycle`
(restart recovery, idle exit, stop).

Nothing is imported here: `driver.kernel.core.Kernel` is the composition root (the CLI builds it), and a
helper of the kernel (`runs`, `states`, `supervision`, ...) is importable without it.
"""
