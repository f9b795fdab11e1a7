"""Permission requests carried over a reattach (PROTOCOL §8.2): the request a dead predecessor announced
keeps its request_id when the re-read output meets it again; one it decided is answered as decided."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import anyio
import pytest

from driver.adapters.common.base import PermissionDecision
from driver.ports.permissions import PermissionBroker, PermissionCommandError
from driver.queue.asked import Asked
from tests.ports.test_permissions import OPTIONS, REQUEST, Recorder, broker

OFFERED = tuple((o.option_id, o.kind) for o in OPTIONS)


def asked(request_id: str = "prm-1-4", *, in_s: float = 60.0, outcome: str | None = None) -> Asked:
    expires = (datetime.now(UTC) + timedelta(seconds=in_s)).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return Asked(request_id, REQUEST.tool_call_id, expires, 1, outcome, "opt-allow" if outcome else None, None, OFFERED)


async def test_an_open_request_keeps_its_id_and_is_not_announced_again() -> None:
    rec = Recorder()
    b = broker(rec)  # this process's prefix is prm-1; the carried id is the predecessor's
    b.carry([asked("prm-0-4")])
    result: list[PermissionDecision] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: _append(result, b))
        with anyio.fail_after(5):
            while b.pending_count == 0:
                await anyio.lowlevel.checkpoint()
        announced = b.resolve("prm-0-4", "opt-reject")
        with anyio.fail_after(5):
            await announced.wait()
    assert result == [PermissionDecision("rejected", "opt-reject", "reject_once")]
    assert rec.kinds == ["permission.resolved"]
    assert rec.payload("permission.resolved")["request_id"] == "prm-0-4"
    assert REQUEST.tool_call_id in b.rejected_tool_calls
    # Met once: the provider asking again for the same tool call is a new request.
    rec2 = Recorder()
    b2 = broker(rec2)
    b2.carry([asked("prm-0-4")])
    b2.resolve("prm-0-4", "opt-allow")  # decided before the output got there again
    assert (await b2.request(REQUEST)).outcome == "allowed"
    assert (
        rec2.kinds == ["permission.resolved"] and rec2.payload("permission.resolved")["decided_by"] == "control_plane"
    )


async def _append(result: list[PermissionDecision], b: PermissionBroker) -> None:
    result.append(await b.request(REQUEST))


async def test_a_request_decided_before_the_death_is_answered_as_decided_and_nothing_is_emitted() -> None:
    rec = Recorder()
    b = broker(rec)
    b.carry([asked(outcome="allowed")])
    with anyio.fail_after(5):
        decision = await b.request(REQUEST)
    assert decision == PermissionDecision("allowed", "opt-allow", "allow_once")
    assert rec.kinds == []


async def test_an_expired_carried_request_times_out_at_once_under_its_own_id() -> None:
    rec = Recorder()
    b = broker(rec, timeout_ms=600_000)
    b.carry([asked("prm-0-1", in_s=-5)])
    with anyio.fail_after(5):
        decision = await b.request(REQUEST)
    assert decision.outcome == "timed_out"
    assert rec.payload("permission.resolved") == {
        "request_id": "prm-0-1",
        "outcome": "timed_out",
        "option_id": "opt-reject",
        "decided_by": "timeout",
    }


async def test_release_resolves_what_was_never_met_again_and_an_unknown_option_is_refused() -> None:
    rec = Recorder()
    b = broker(rec)
    b.carry([asked("prm-0-1"), asked("prm-0-2", outcome="allowed")])
    with pytest.raises(PermissionCommandError) as info:
        b.resolve("prm-0-1", "opt-nope")
    assert info.value.code == "permission.unknown_option"
    announced = b.resolve("prm-0-1", "opt-allow")
    await b.release_carried()
    assert announced.is_set()
    assert [p for k, p in rec.events] == [
        {"request_id": "prm-0-1", "outcome": "cancelled", "option_id": None, "decided_by": "cancel"}
    ]
    with pytest.raises(PermissionCommandError):
        b.resolve("prm-0-1", "opt-allow")  # released: unknown from here on
