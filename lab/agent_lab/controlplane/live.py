"""Live notifications inside the control plane: subscriptions and a change signal.

Everything runs on the server's event loop, so plain asyncio objects suffice. Subscriber queues are
unbounded on purpose: the consumers (tests, the `dev` chat) read as fast as a turn produces, and a
bounded queue would silently drop what a test is waiting for.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Any

Item = dict[str, Any]
_CLOSED: Item = {"type": "__closed__"}


class Subscription:
    """Items published for one instance (or all) after `subscribe()`: an async iterator of dicts.

    Each item is a dict with a `type`: `event` (a stored event's fields beside it), `command.update`,
    `heartbeat` or `link` (`state` = `up` | `down`).
    """

    def __init__(self, broker: Broker, instance_id: str | None) -> None:
        self.instance_id = instance_id
        self._broker = broker
        self._queue: asyncio.Queue[Item] = asyncio.Queue()
        self._closed = False

    def _put(self, item: Item) -> None:
        if not self._closed:
            self._queue.put_nowait(item)

    async def get(self, timeout: float | None = None) -> Item:
        """The next item; raises TimeoutError after `timeout` seconds, StopAsyncIteration once closed."""
        async with asyncio.timeout(timeout):
            item = await self._queue.get()
        if item is _CLOSED:
            self._queue.put_nowait(_CLOSED)
            raise StopAsyncIteration
        return item

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._broker._remove(self)
            self._queue.put_nowait(_CLOSED)

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Item:
        return await self.get()

    def __enter__(self) -> Subscription:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class Broker:
    def __init__(self) -> None:
        self._subs: set[Subscription] = set()
        self._changed = asyncio.Event()

    def subscribe(self, instance_id: str | None = None) -> Subscription:
        sub = Subscription(self, instance_id)
        self._subs.add(sub)
        return sub

    def _remove(self, sub: Subscription) -> None:
        self._subs.discard(sub)

    def has_subscribers(self, instance_id: str) -> bool:
        return any(sub.instance_id is None or sub.instance_id == instance_id for sub in self._subs)

    def publish_many(self, instance_id: str, items: list[Item]) -> None:
        """Deliver a batch's items, then wake `wait_until` callers once (not once per event)."""
        for sub in list(self._subs):
            if sub.instance_id is None or sub.instance_id == instance_id:
                for item in items:
                    sub._put(item)
        self.changed()

    def publish(self, instance_id: str, item: Item) -> None:
        for sub in list(self._subs):
            if sub.instance_id is None or sub.instance_id == instance_id:
                sub._put(item)
        self.changed()

    def changed(self) -> None:
        """Wake every `wait_until` caller so it re-checks its condition."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_change(self) -> None:
        await self._changed.wait()

    def close_all(self) -> None:
        for sub in list(self._subs):
            sub.close()
