"""Group commit for the control plane's store.

Every write goes through `GroupWriter.submit`. Writes that queue up while a COMMIT is on its way to disk
are applied together in the next transaction, so a driver that pipelines batches (and several drivers at
once) pay one fsync per group instead of one per batch. Each write is a savepoint inside the group: one
that fails undoes only itself. A write's future resolves only after the COMMIT that contains it, which is
what lets the server send a receipt the moment the future resolves.

All SQLite work happens in one dedicated thread that owns the write connection; the event loop only
queues work and resolves futures.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from agent_lab.controlplane.store import Store

R = TypeVar("R")
_Item = tuple[Callable[..., Any], tuple[Any, ...], "asyncio.Future[Any]"]


class GroupWriter:
    def __init__(self, path: Path) -> None:
        self._path = path
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cp-store")
        self._store: Store | None = None
        self._pending: list[_Item] = []
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()  # set when nothing is queued or being written
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self.commits = 0  # transactions committed, for tests and benchmarks
        self.writes = 0

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._store = await loop.run_in_executor(self._executor, Store, self._path)
        self._task = asyncio.ensure_future(self._run())

    def submit(self, fn: Callable[..., R], *args: Any) -> asyncio.Future[R]:
        """Queue `fn(store, *args)`; the future resolves after the COMMIT that contains it."""
        if self._task is None:
            raise RuntimeError("control plane is not running")
        fut: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._pending.append((fn, args, fut))
        self._idle.clear()
        self._wake.set()
        return fut

    async def close(self) -> None:
        """Finish every queued write, then close the connection and the thread."""
        if self._task is None:
            return
        await self._idle.wait()
        self._task.cancel()
        self._task = None
        loop = asyncio.get_running_loop()
        if self._store is not None:
            await loop.run_in_executor(self._executor, self._store.close)
            self._store = None
        self._executor.shutdown(wait=True)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            items, self._pending = self._pending, []
            if items:
                outcomes = await loop.run_in_executor(self._executor, self._apply, items)
                self.commits += 1
                self.writes += len(items)
                for (_, _, fut), (ok, value) in zip(items, outcomes, strict=True):
                    if fut.done():
                        continue
                    if ok:
                        fut.set_result(value)
                    else:
                        fut.set_exception(value)
            if not self._pending:
                self._idle.set()

    def _apply(self, items: list[_Item]) -> list[tuple[bool, Any]]:
        """In the store thread: every item in one transaction, each in its own savepoint."""
        store = self._store
        assert store is not None
        outcomes: list[tuple[bool, Any]] = []
        try:
            with store.transaction():
                for fn, args, _ in items:
                    try:
                        outcomes.append((True, fn(store, *args)))
                    except Exception as exc:  # this write only: its savepoint was rolled back
                        outcomes.append((False, exc))
        except Exception as exc:  # the COMMIT failed: nothing of the group is stored
            return [(False, exc)] * len(items)
        return outcomes
