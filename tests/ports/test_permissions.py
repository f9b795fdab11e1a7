"""The permissions port (PROTOCOL §6.2): supervised requests, resolution, timeout, cancel, full_access."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import anyio
import anyio.lowlevel
import pytest

from driver.adapters.common.base import PermissionDecision, PermissionOption, PermissionRequest
from driver.ports.permissions import PermissionBroker, PermissionCommandError
from driver.protocol.events import validate_payload

OPTIONS = (
    PermissionOption("opt-allow", "allow_once", "Allow"),
    PermissionOption("opt-always", "allow_always", "Always allow"),
    PermissionOption("opt-reject", "reject_once", "Reject"),
)
REQUEST = PermissionRequest("tool-1", "Run `ls`", OPTIONS, tool_name="shell", tool_input={"cmd": "ls"})


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.requested = anyio.Event()
        self.pending_counts: list[int] = []

    async def emit(self, kind: str, payload: dict[str, Any]) -> None:
        validate_payload(kind, payload)  # what the kernel does on every emit: the schema must hold
        self.events.append((kind, payload))
        if kind == "permission.requested":
            self.requested.set()

    @property
    def kinds(self) -> list[str]:
        return [k for k, _ in self.events]

    def payload(self, kind: str) -> dict[str, Any]:
        return next(p for k, p in self.events if k == kind)


def broker(
    rec: Recorder, policy: Literal["full_access", "supervised"] = "supervised", timeout_ms: int = 60_000
) -> PermissionBroker:
    return PermissionBroker(
        rec.emit, policy=policy, timeout_ms=timeout_ms, id_prefix="prm-1", on_pending_change=rec.pending_counts.append
    )


async def ask_and(rec: Recorder, b: PermissionBroker, act: Any) -> PermissionDecision:
    """Start a request, wait until it was emitted, apply `act(request_id)`, return the decision."""
    result: list[PermissionDecision] = []

    async def asker() -> None:
        result.append(await b.request(REQUEST))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(asker)
            await rec.requested.wait()
            act(rec.payload("permission.requested")["request_id"])
    return result[0]


async def test_supervised_request_is_resolved_by_the_control_plane() -> None:
    rec = Recorder()
    b = broker(rec)
    decision = await ask_and(rec, b, lambda rid: b.resolve(rid, "opt-always"))
    assert decision == PermissionDecision("allowed", "opt-always", "allow_always")
    assert rec.kinds == ["permission.requested", "permission.resolved"]
    requested = rec.payload("permission.requested")
    assert requested["request_id"] == "prm-1-1" and requested["tool_call_id"] == "tool-1"
    assert requested["title"] == "Run `ls`"
    assert requested["options"] == [{"option_id": o.option_id, "kind": o.kind, "label": o.label} for o in OPTIONS]
    assert rec.payload("permission.resolved") == {
        "request_id": "prm-1-1",
        "outcome": "allowed",
        "option_id": "opt-always",
        "decided_by": "control_plane",
    }
    assert rec.pending_counts == [1, 0]
    assert b.pending_count == 0
    assert "tool-1" not in b.rejected_tool_calls


async def test_expires_at_is_now_plus_the_timeout() -> None:
    rec = Recorder()
    b = broker(rec, timeout_ms=300_000)
    before = datetime.now(UTC)
    await ask_and(rec, b, lambda rid: b.resolve(rid, "opt-allow"))
    expires = datetime.fromisoformat(rec.payload("permission.requested")["expires_at"].replace("Z", "+00:00"))
    assert before + timedelta(seconds=299) <= expires <= datetime.now(UTC) + timedelta(seconds=301)


async def test_a_reject_option_rejects_and_marks_the_tool_call() -> None:
    rec = Recorder()
    b = broker(rec)
    decision = await ask_and(rec, b, lambda rid: b.resolve(rid, "opt-reject"))
    assert decision.outcome == "rejected" and decision.option_kind == "reject_once"
    assert rec.payload("permission.resolved")["outcome"] == "rejected"
    assert "tool-1" in b.rejected_tool_calls


async def test_unknown_option_is_an_error_and_the_request_stays_pending() -> None:
    rec = Recorder()
    b = broker(rec)
    errors: list[str] = []

    def act(rid: str) -> None:
        with pytest.raises(PermissionCommandError) as info:
            b.resolve(rid, "opt-nope")
        errors.append(info.value.code)
        assert b.pending_count == 1
        b.resolve(rid, "opt-allow")

    decision = await ask_and(rec, b, act)
    assert errors == ["permission.unknown_option"]
    assert decision.outcome == "allowed"


async def test_unknown_or_settled_request_is_an_error() -> None:
    rec = Recorder()
    b = broker(rec)
    with pytest.raises(PermissionCommandError) as info:
        b.resolve("prm-1-99", "opt-allow")
    assert info.value.code == "permission.unknown_request"
    await ask_and(rec, b, lambda rid: b.resolve(rid, "opt-allow"))
    with pytest.raises(PermissionCommandError) as again:
        b.resolve("prm-1-1", "opt-allow")
    assert again.value.code == "permission.unknown_request"


async def test_no_answer_times_out_as_a_rejection() -> None:
    rec = Recorder()
    b = broker(rec, timeout_ms=50)
    with anyio.fail_after(5):
        decision = await b.request(REQUEST)
    assert decision == PermissionDecision("timed_out", "opt-reject", "reject_once")
    assert rec.kinds == ["permission.requested", "permission.resolved"]
    resolved = rec.payload("permission.resolved")
    assert resolved["outcome"] == "timed_out" and resolved["decided_by"] == "timeout"
    assert resolved["option_id"] == "opt-reject"
    assert "tool-1" in b.rejected_tool_calls
    assert b.pending_count == 0 and rec.pending_counts == [1, 0]


async def test_cancel_all_cancels_every_pending_request() -> None:
    rec = Recorder()
    b = broker(rec)
    results: list[PermissionDecision] = []
    other = PermissionRequest("tool-2", "Write a file", OPTIONS)

    async def asker(req: PermissionRequest) -> None:
        results.append(await b.request(req))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(asker, REQUEST)
            tg.start_soon(asker, other)
            while b.pending_count < 2:
                await anyio.lowlevel.checkpoint()
            assert b.cancel_all() == 2
    assert [r.outcome for r in results] == ["cancelled", "cancelled"]
    resolved = [p for k, p in rec.events if k == "permission.resolved"]
    assert {(p["outcome"], p["decided_by"], p["option_id"]) for p in resolved} == {("cancelled", "cancel", None)}
    assert len(resolved) == 2
    assert b.cancel_all() == 0
    assert {"tool-1", "tool-2"} <= b.rejected_tool_calls


async def test_full_access_allows_by_policy_and_records_it() -> None:
    rec = Recorder()
    b = broker(rec, policy="full_access")
    with anyio.fail_after(5):
        decision = await b.request(REQUEST)
    assert decision == PermissionDecision("allowed", "opt-allow", "allow_once")
    assert rec.kinds == ["permission.requested", "permission.resolved"]
    resolved = rec.payload("permission.resolved")
    assert (resolved["outcome"], resolved["decided_by"]) == ("allowed", "policy")
    assert b.pending_count == 0 and rec.pending_counts == []


async def test_request_ids_are_unique() -> None:
    rec = Recorder()
    b = broker(rec, policy="full_access")
    for _ in range(3):
        await b.request(REQUEST)
    ids = [p["request_id"] for k, p in rec.events if k == "permission.requested"]
    assert ids == ["prm-1-1", "prm-1-2", "prm-1-3"]


class SlowRecorder(Recorder):
    """`emit` of `permission.requested` held up (the outbox applying backpressure) for `delay_s`."""

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s = delay_s
        self.emitting = anyio.Event()

    async def emit(self, kind: str, payload: dict[str, Any]) -> None:
        if kind == "permission.requested":
            self.emitting.set()
            await anyio.sleep(self.delay_s)  # simulated backpressure, not a wait for a condition
        await super().emit(kind, payload)


@pytest.mark.serial  # the timeout measured to a tenth of a second
async def test_timeout_fires_at_expires_at_even_when_emit_blocks() -> None:
    rec = SlowRecorder(delay_s=1.0)
    b = broker(rec, timeout_ms=1200)
    started = anyio.current_time()
    with anyio.fail_after(10):
        decision = await b.request(REQUEST)
    elapsed = anyio.current_time() - started
    assert decision.outcome == "timed_out"
    # Before the fix the 1.2 s timeout started after the 1 s emit: 2.2 s.
    assert 1.15 <= elapsed < 1.8, elapsed
    expires = datetime.fromisoformat(rec.payload("permission.requested")["expires_at"].replace("Z", "+00:00"))
    assert abs((datetime.now(UTC) - expires).total_seconds()) < 0.6


async def test_an_answer_arriving_while_emit_is_still_blocked_is_kept() -> None:
    """The request is pending from the moment its id exists: a CP that received the event (sent
    while `emit` still waits on the journal) and answers at once is not told `unknown_request`."""
    rec = SlowRecorder(delay_s=0.5)
    b = broker(rec)
    result: list[PermissionDecision] = []

    async def asker() -> None:
        result.append(await b.request(REQUEST))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(asker)
            await rec.emitting.wait()
            b.resolve("prm-1-1", "opt-allow")
    assert result[0].outcome == "allowed"


async def test_a_request_the_provider_withdraws_resolves_cancelled() -> None:
    rec = Recorder()
    b = broker(rec)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:

            async def asker() -> None:
                await b.request(REQUEST)

            tg.start_soon(asker)
            await rec.requested.wait()
            tg.cancel_scope.cancel()  # what a provider's `$/cancel_request` / `serverRequest/resolved` does
    assert rec.kinds == ["permission.requested", "permission.resolved"]
    assert rec.payload("permission.resolved")["outcome"] == "cancelled"
    assert rec.payload("permission.resolved")["decided_by"] == "cancel"
    assert b.pending_count == 0


async def test_requests_past_the_open_bound_are_rejected_at_once_with_a_bounded_diagnostic() -> None:
    """`MAX_OPEN_REQUESTS` open: each further request is rejected (its reject option) without
    `permission.requested`; the first `OVERFLOW_DIAGNOSTICS` refusals are reported, then one saying the
    rest are only logged. A slot freed by a decision is usable again."""
    from driver.ports.permissions import MAX_OPEN_REQUESTS, OVERFLOW_DIAGNOSTICS

    rec = Recorder()
    b = broker(rec)
    decisions: list[PermissionDecision] = []

    async def asker(i: int) -> None:
        decisions.append(await b.request(PermissionRequest(f"tool-{i}", "Run", OPTIONS)))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            for i in range(MAX_OPEN_REQUESTS):
                tg.start_soon(asker, i)
            while b.pending_count < MAX_OPEN_REQUESTS:
                await anyio.lowlevel.checkpoint()
            over = [
                await b.request(PermissionRequest(f"over-{i}", "Run", OPTIONS)) for i in range(OVERFLOW_DIAGNOSTICS + 3)
            ]
            assert all(d == PermissionDecision("rejected", "opt-reject", "reject_once") for d in over)
            assert rec.kinds.count("permission.requested") == MAX_OPEN_REQUESTS
            diagnostics = [p for k, p in rec.events if k == "diagnostic.reported"]
            assert len(diagnostics) == OVERFLOW_DIAGNOSTICS + 1
            assert {d["code"] for d in diagnostics} == {"permission.too_many_open"}
            assert "only logged" in diagnostics[-1]["message"]
            assert {f"over-{i}" for i in range(len(over))} <= b.rejected_tool_calls
            assert b.refused_over_cap == len(over)
            # One decided: the next request is asked of the CP again.
            first = next(p for k, p in rec.events if k == "permission.requested")
            b.resolve(first["request_id"], "opt-allow")
            while b.pending_count == MAX_OPEN_REQUESTS:
                await anyio.lowlevel.checkpoint()
            tg.start_soon(asker, 999)
            while rec.kinds.count("permission.requested") == MAX_OPEN_REQUESTS:
                await anyio.lowlevel.checkpoint()
            b.cancel_all()
    assert b.refused_over_cap == len(over)


async def test_full_access_has_no_open_bound() -> None:
    """Under full_access nothing stays open: a burst past the bound is all allowed by policy."""
    from driver.ports.permissions import MAX_OPEN_REQUESTS

    rec = Recorder()
    b = broker(rec, policy="full_access")
    decisions = [await b.request(PermissionRequest(f"t{i}", "Run", OPTIONS)) for i in range(MAX_OPEN_REQUESTS + 2)]
    assert all(d.outcome == "allowed" for d in decisions) and b.refused_over_cap == 0
