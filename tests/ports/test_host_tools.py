"""The host-tools broker (PROTOCOL §6.3): every call ends with exactly one `host_tool.resolved`."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from driver.adapters.common.base import HostToolReply
from driver.ports.host_tools import HostToolBroker, HostToolCommandError


class Events:
    def __init__(self) -> None:
        self.items: list[tuple[str, dict[str, Any]]] = []
        self.called = anyio.Event()

    async def emit(self, kind: str, payload: dict[str, Any]) -> str:
        self.items.append((kind, payload))
        if kind == "host_tool.called":
            self.called.set()
        return f"evt-{len(self.items)}"

    def resolved(self) -> list[dict[str, Any]]:
        return [p for k, p in self.items if k == "host_tool.resolved"]


def broker(events: Events, timeout_s: float = 5.0) -> HostToolBroker:
    return HostToolBroker(
        events.emit, id_prefix="htc-1", current_run=lambda: "run-1", known={"lookup"}, timeout_s=timeout_s
    )


async def call_in_background(b: HostToolBroker, out: list[HostToolReply]) -> None:
    out.append(await b.call("lookup", {"q": "x"}))


async def test_answered_call_resolves_completed_once() -> None:
    ev = Events()
    b = broker(ev)
    out: list[HostToolReply] = []
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(call_in_background, b, out)
            await ev.called.wait()
            b.deliver("htc-1-1", [{"type": "text", "text": "ok"}], False)
            with pytest.raises(HostToolCommandError):
                b.deliver("htc-1-1", [{"type": "text", "text": "again"}], False)
    assert out == [HostToolReply([{"type": "text", "text": "ok"}], False)]
    assert ev.resolved() == [{"call_id": "htc-1-1", "outcome": "completed"}]
    assert b.pending_count == 0


async def test_unanswered_call_times_out_with_an_error_result() -> None:
    ev = Events()
    b = broker(ev, timeout_s=0.2)
    with anyio.fail_after(5):
        reply = await b.call("lookup", {})
    assert reply.is_error and "no result within" in reply.content[0]["text"]
    assert ev.resolved() == [{"call_id": "htc-1-1", "outcome": "timed_out"}]
    with pytest.raises(HostToolCommandError):  # a late answer is refused, not delivered twice
        b.deliver("htc-1-1", [], False)


async def test_cancelled_run_resolves_its_open_calls_cancelled() -> None:
    ev = Events()
    b = broker(ev)
    out: list[HostToolReply] = []
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(call_in_background, b, out)
            await ev.called.wait()
            await b.cancel_run("run-1")
    assert out[0].is_error
    assert ev.resolved() == [{"call_id": "htc-1-1", "outcome": "cancelled"}]


async def test_provider_side_cancellation_resolves_cancelled() -> None:
    ev = Events()
    b = broker(ev)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(b.call, "lookup", {})
            await ev.called.wait()
            tg.cancel_scope.cancel()
    assert ev.resolved() == [{"call_id": "htc-1-1", "outcome": "cancelled"}]


async def test_finally_rejected_call_resolves_failed_instead_of_hanging() -> None:
    ev = Events()
    b = broker(ev)
    out: list[HostToolReply] = []
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(call_in_background, b, out)
            await ev.called.wait()
            assert b.rejected("evt-1") is True
            assert b.rejected("evt-unknown") is False
    assert out[0].is_error
    assert ev.resolved() == [{"call_id": "htc-1-1", "outcome": "failed"}]


async def test_unknown_tool_is_an_error_without_events() -> None:
    ev = Events()
    reply = await broker(ev).call("nope", {})
    assert reply.is_error and ev.items == []
