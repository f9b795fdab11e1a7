"""One store interface, two engines: SQLite (embedded, the default) and PostgreSQL (N gateways over one
database), chosen by the store's name: a `postgresql://` URL is PostgreSQL, anything else a SQLite file.

The control plane talks to an `Engine`: asynchronous writes that return after their COMMIT (so a receipt
built from a result is only sent for stored events), and `Reads` (synchronous queries: the tests, the HTTP
API and the console read on the event loop, as they always have with SQLite). Cross-gateway notices (a
command stored by another gateway, a takeover, a termination) reach the control plane through `notices`;
SQLite has one process, so it has none.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

from agent_lab.controlplane.store import Store
from agent_lab.controlplane.store_rows import BatchResult, EpochVerdict, StoredRejection
from agent_lab.controlplane.validation import ValidEvent
from agent_lab.controlplane.writer import GroupWriter

# (kind, instance_id, value): ("command", instance, command_id), ("takeover", instance, generation),
# ("terminated", instance, None).
Notice = tuple[str, str, Any]


class Reads(Protocol):
    """The queries both engines answer (synchronously, seeing every committed write)."""

    def close(self) -> None: ...
    def highest_epoch(self, instance_id: str) -> int: ...
    def link_generation(self, instance_id: str) -> int: ...
    def events(
        self,
        instance_id: str,
        kinds: Iterable[str] | None = None,
        run_id: str | None = None,
        after_seq: int | None = None,
        limit: int | None = None,
        delivery: str | None = None,
    ) -> list[dict[str, Any]]: ...
    def count_events(self, instance_id: str | None = None) -> int: ...
    def commands(self, instance_id: str) -> list[dict[str, Any]]: ...
    def command(self, command_id: str) -> dict[str, Any] | None: ...
    def pending_commands(self, instance_id: str, after_seq: int) -> list[dict[str, Any]]: ...
    def command_updates(self, command_id: str) -> list[dict[str, Any]]: ...
    def checkpoints(self, instance_id: str) -> list[dict[str, Any]]: ...
    def latest_checkpoint(self, instance_id: str) -> dict[str, Any] | None: ...
    def checkpoint_blob(self, sha256: str) -> bytes | None: ...


class Engine(Protocol):
    """The writes both engines make; each returns (or resolves) after its COMMIT."""

    name: str
    notices: Callable[[Notice], None] | None

    async def start(self) -> None: ...
    async def close(self) -> None: ...
    def open_reads(self) -> Reads: ...
    async def claim(self, instance_id: str, epoch: int) -> EpochVerdict: ...
    def insert_events(
        self, instance_id: str, generation: int, events: Sequence[ValidEvent], rejected: Sequence[StoredRejection]
    ) -> asyncio.Future[BatchResult]: ...
    async def add_command(
        self, instance_id: str, kind: str, fields: dict[str, Any], command_id: str | None
    ) -> dict[str, Any]: ...
    async def record_update(
        self,
        instance_id: str,
        command_id: str,
        status: str,
        result: dict[str, Any] | None,
        error: dict[str, Any] | None,
    ) -> bool: ...
    async def terminate(self, instance_id: str) -> None: ...


def is_postgres(store: str | Path) -> bool:
    return isinstance(store, str) and store.startswith(("postgresql://", "postgres://"))


def open_engine(store: str | Path, gateway_id: str = "gw-1") -> Engine:
    """The engine for a store name: a `postgresql://` URL, or a SQLite file path."""
    if is_postgres(store):
        from agent_lab.controlplane.pg_store import PgEngine

        return PgEngine(str(store), gateway_id)
    return SqliteEngine(Path(store))


class SqliteEngine:
    """The embedded engine: one writer thread with group commit (`writer.GroupWriter`) over `Store`."""

    name = "sqlite"

    def __init__(self, path: Path) -> None:
        self.path = path
        self.notices: Callable[[Notice], None] | None = None
        self._writer: GroupWriter | None = None

    async def start(self) -> None:
        self._writer = GroupWriter(self.path)
        await self._writer.start()

    async def close(self) -> None:
        if self._writer is not None:
            await self._writer.close()
            self._writer = None

    def open_reads(self) -> Reads:
        return Store(self.path, create=False)

    @property
    def writer(self) -> GroupWriter:
        if self._writer is None:
            raise RuntimeError("control plane is not running")
        return self._writer

    async def claim(self, instance_id: str, epoch: int) -> EpochVerdict:
        return await self.writer.submit(Store.observe_epoch, instance_id, epoch)

    def insert_events(
        self, instance_id: str, generation: int, events: Sequence[ValidEvent], rejected: Sequence[StoredRejection]
    ) -> asyncio.Future[BatchResult]:
        return self.writer.submit(Store.insert_events, instance_id, events, rejected, generation)

    async def add_command(
        self, instance_id: str, kind: str, fields: dict[str, Any], command_id: str | None
    ) -> dict[str, Any]:
        return await self.writer.submit(Store.add_command, instance_id, kind, fields, command_id)

    async def record_update(
        self,
        instance_id: str,
        command_id: str,
        status: str,
        result: dict[str, Any] | None,
        error: dict[str, Any] | None,
    ) -> bool:
        return await self.writer.submit(Store.record_update, instance_id, command_id, status, result, error)

    async def terminate(self, instance_id: str) -> None:
        await self.writer.submit(Store.terminate, instance_id)
