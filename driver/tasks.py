"""The one way the driver starts a task (issue 30, PROTOCOL §9: "Nothing the agent controls kills the
driver"; THREATS.md item 5).

A task started raw on an anyio task group (`start_soon`) that raises takes its group down, and from
the kernel's group the process: one bug the agent can trigger (a provider home replaced by a file)
became an exit 70 on every later start. So nothing in the driver gets a raw task group: this module
opens them and hands out a `Tasks`, which offers guarded spawns only. There are two kinds of group:

- `boundary(name, report)`: a supervision boundary (the kernel's group for the process's life, the
  supervisor's tasks). A task that raises is logged with its traceback and reported as a lossless
  `diagnostic.reported{code: driver.internal_error}` naming its unit; the group and its other tasks
  go on. `keep` restarts a long-lived task with backoff; `essential` is the outbox's writer, the one
  task whose failure is the process's (driver.guard.essential).
- `within(name)`: helper tasks of one unit that is itself under a boundary (a turn, a connection, a
  peer's read loop, a process's life). A task that raises cancels its siblings and its exception
  leaves the `async with` to the unit that opened the group, which fails (a run `driver.internal_error`,
  a connection closed 1011, a peer closed) and is reported by that unit's own boundary.

tests/test_layout.py fails when any other module of `driver/` opens a task group or calls
`start_soon`/`start` on one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc

from driver import guard

TaskFn = Callable[..., Coroutine[Any, Any, Any]]


class Tasks:
    """A task group that only offers guarded spawns (see the module's docstring)."""

    def __init__(self, tg: anyio.abc.TaskGroup, name: str, report: guard.Emits | None) -> None:
        self._tg = tg
        self.name = name
        self._report = report

    @property
    def is_boundary(self) -> bool:
        return self._report is not None

    @property
    def cancel_scope(self) -> anyio.CancelScope:
        return self._tg.cancel_scope

    def cancel(self) -> None:
        """Cancel every task of the group (and the body of its `async with`)."""
        self._tg.cancel_scope.cancel()

    def spawn(self, fn: TaskFn, *args: Any) -> None:
        """Start `fn(*args)`. In a boundary its unexpected exception is logged and reported (unit: the
        task's name) and ends that task alone (driver.guard.supervised); within a unit it fails the unit."""
        if self._report is not None:
            self._tg.start_soon(guard.supervised, self._report, fn, *args)
        else:
            self._tg.start_soon(fn, *args)

    def keep(self, name: str, fn: Callable[[], Coroutine[Any, Any, Any]]) -> None:
        """A long-lived task of a boundary: restarted with backoff after an unexpected exception."""
        assert self._report is not None, "keep() needs a boundary"
        self._tg.start_soon(guard.keep, self._report, name, fn)

    def essential(
        self, name: str, fn: Callable[[], Coroutine[Any, Any, Any]], on_failure: Callable[[], Awaitable[None]]
    ) -> None:
        """The task the driver cannot run without (driver.guard.essential): its failure calls `on_failure`."""
        self._tg.start_soon(guard.essential, name, fn, on_failure)


@asynccontextmanager
async def boundary(name: str, report: guard.Emits) -> AsyncIterator[Tasks]:
    """A task group that is a supervision boundary: a failed task is reported and the rest goes on."""
    async with anyio.create_task_group() as tg:
        yield Tasks(tg, name, report)


@asynccontextmanager
async def within(name: str) -> AsyncIterator[Tasks]:
    """The helper tasks of one unit: a failed task fails the unit that opened the group."""
    async with anyio.create_task_group() as tg:
        yield Tasks(tg, name, None)
