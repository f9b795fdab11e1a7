"""Each fault knob, on a live link (and the pure policy on its own)."""

from __future__ import annotations

import asyncio
import time

import msgspec
import pytest
from agent_lab.controlplane import ControlPlane, Faults

from tests.controlplane.client import INSTANCE, batch, close_code, dial, event, handshake, recv, send


def ids(*seqs: int) -> list[str]:
    return [event(s)["event_id"] for s in seqs]


def deltas(*seqs: int) -> list[dict[str, object]]:
    return [event(s, "message.delta") for s in seqs]


async def test_withheld_receipt_is_never_sent_but_events_are_stored(cp: ControlPlane) -> None:
    ws, _ = await handshake(cp.url)
    cp.faults.withhold_receipts = True
    await send(ws, batch(1, deltas(1, 2)))
    await cp.wait_until(lambda: cp.store.count_events(INSTANCE) == 2)
    cp.faults.withhold_receipts = False
    await send(ws, batch(2, deltas(3)))
    # Frames are ordered: had batch 1 been answered, its receipt would arrive first.
    assert (await recv(ws))["batch"] == 2
    await ws.close()


async def test_delayed_receipt_arrives_late(cp: ControlPlane) -> None:
    ws, _ = await handshake(cp.url)
    cp.faults.receipt_delay_ms = 300
    started = time.monotonic()
    await send(ws, batch(1, deltas(1)))
    receipt = await recv(ws)
    assert time.monotonic() - started >= 0.3
    assert receipt["accepted"] == ids(1)
    await ws.close()


async def test_delayed_receipts_do_not_block_other_frames(cp: ControlPlane) -> None:
    ws, _ = await handshake(cp.url)
    cp.faults.receipt_delay_ms = 1000
    await send(ws, batch(1, deltas(1)))
    command_id, _ = await cp.send_command(INSTANCE, "session.reset", reason="x")
    # The command sent after the batch overtakes the delayed receipt.
    assert (await recv(ws))["command_id"] == command_id
    assert (await recv(ws))["type"] == "receipt"
    await ws.close()


async def test_partial_receipt_leaves_the_rest_in_neither_list(cp: ControlPlane) -> None:
    ws, _ = await handshake(cp.url)
    cp.faults.partial_receipt_events = 2
    await send(ws, batch(1, deltas(1, 2, 3, 4)))
    receipt = await recv(ws)
    assert receipt["accepted"] == ids(1, 2)
    assert receipt["rejected"] == []
    assert [e["seq"] for e in cp.events(INSTANCE)] == [1, 2]
    await ws.close()


async def test_duplicate_receipts(cp: ControlPlane) -> None:
    ws, _ = await handshake(cp.url)
    cp.faults.duplicate_receipts = True
    await send(ws, batch(1, deltas(1)))
    first, second = await recv(ws), await recv(ws)
    assert first == second
    assert first["accepted"] == ids(1)
    await ws.close()


async def test_reordered_receipts(cp: ControlPlane) -> None:
    ws, _ = await handshake(cp.url)
    cp.faults.reorder_receipts = True
    await send(ws, batch(1, deltas(1)))
    await send(ws, batch(2, deltas(2)))
    assert [(await recv(ws))["batch"] for _ in range(2)] == [2, 1]
    await ws.close()


@pytest.mark.parametrize("retryable", [True, False])
async def test_reject_next_events_is_one_shot(cp: ControlPlane, retryable: bool) -> None:
    ws, _ = await handshake(cp.url)
    cp.faults.reject_next_events = 2
    cp.faults.reject_retryable = retryable
    await send(ws, batch(1, deltas(1, 2, 3)))
    receipt = await recv(ws)
    assert receipt["accepted"] == ids(3)
    assert [(r["event_id"], r["code"], r["retryable"]) for r in receipt["rejected"]] == [
        (i, "fault.injected", retryable) for i in ids(1, 2)
    ]
    assert cp.faults.reject_next_events == 0
    await send(ws, batch(2, deltas(1, 2)))
    assert (await recv(ws))["accepted"] == ids(1, 2)
    assert [e["seq"] for e in cp.events(INSTANCE)] == [1, 2, 3]
    await ws.close()


async def test_close_after_frames_before_receipt_stores_but_does_not_answer(cp: ControlPlane) -> None:
    ws, _ = await handshake(cp.url)
    cp.faults.update({"close_after_frames": 2, "close_frame_type": "events", "close_code": 1011})
    await send(ws, batch(1, deltas(1)))
    assert (await recv(ws))["batch"] == 1
    await send(ws, batch(2, deltas(2)))
    assert await close_code(ws) == 1011
    assert [e["seq"] for e in cp.events(INSTANCE)] == [1, 2]
    assert cp.faults.close_after_frames is None  # one shot


async def test_close_before_store_drops_the_batch(cp: ControlPlane) -> None:
    ws, _ = await handshake(cp.url)
    cp.faults.update({"close_after_frames": 1, "close_stage": "before_store", "close_code": 1012})
    await send(ws, batch(1, deltas(1)))
    assert await close_code(ws) == 1012
    assert cp.events(INSTANCE) == []


async def test_close_after_receipt(cp: ControlPlane) -> None:
    ws, _ = await handshake(cp.url)
    cp.faults.update({"close_after_frames": 1, "close_stage": "after_receipt", "close_code": 4408})
    await send(ws, batch(1, deltas(1)))
    assert (await recv(ws))["accepted"] == ids(1)
    assert await close_code(ws) == 4408


async def test_close_with_1006_drops_the_connection(cp: ControlPlane) -> None:
    ws, _ = await handshake(cp.url)
    cp.faults.update({"close_after_frames": 1, "close_code": 1006})
    await send(ws, batch(1, deltas(1)))
    assert await close_code(ws) is None  # no close frame: an abnormal closure


async def test_reject_auth(cp: ControlPlane) -> None:
    cp.faults.reject_auth = True
    ws = await dial(cp.url)
    assert await close_code(ws) == 4401
    cp.faults.reject_auth = False
    ws, _ = await handshake(cp.url)
    await ws.close()


async def test_link_is_usable_again_after_a_fault_close(cp: ControlPlane) -> None:
    ws, _ = await handshake(cp.url)
    cp.faults.update({"close_after_frames": 1, "close_code": 1011})
    await send(ws, batch(1, deltas(1)))
    assert await close_code(ws) == 1011
    await cp.wait_disconnected(INSTANCE)
    ws, _ = await handshake(cp.url)
    await send(ws, batch(2, deltas(1, 2)))  # the resend: 1 is a duplicate, accepted again
    assert (await recv(ws))["accepted"] == ids(1, 2)
    assert cp.store.count_events(INSTANCE) == 2
    await ws.close()


# -- the policy alone ---------------------------------------------------------------------------


def test_policy_admit_partial_then_reject() -> None:
    f = Faults(partial_receipt_events=3, reject_next_events=1, reject_retryable=False)
    stored, rejected = f.admit(["a", "b", "c", "d"])
    assert (stored, rejected) == (["b", "c"], [("a", False)])
    assert f.admit(["x"]) == (["x"], [])


def test_policy_receipt_plans() -> None:
    assert Faults().plan_receipt(b"r1", None) == ([(0, b"r1")], None)
    assert Faults(withhold_receipts=True).plan_receipt(b"r1", None) == ([], None)
    assert Faults(duplicate_receipts=True, receipt_delay_ms=5).plan_receipt(b"r1", None) == (
        [(5, b"r1"), (5, b"r1")],
        None,
    )
    reorder = Faults(reorder_receipts=True)
    assert reorder.plan_receipt(b"r1", None) == ([], b"r1")
    assert reorder.plan_receipt(b"r2", b"r1") == ([(0, b"r2"), (0, b"r1")], None)


def test_policy_close_countdown_filters_by_type() -> None:
    f = Faults(close_after_frames=2, close_frame_type="events", close_code=1011)
    assert f.count_frame("heartbeat") is None
    assert f.count_frame("events") is None
    assert f.count_frame("events") == ("before_receipt", 1011)
    assert f.count_frame("events") is None


def test_update_validates_and_is_all_or_nothing() -> None:
    f = Faults()
    with pytest.raises(msgspec.ValidationError, match="nonsense"):
        f.update({"withhold_receipts": True, "nonsense": 1})
    with pytest.raises(msgspec.ValidationError, match="close_code"):
        f.update({"close_code": 999})
    with pytest.raises(msgspec.ValidationError, match="close_stage"):
        f.update({"close_stage": "sometime"})
    assert f.withhold_receipts is False
    f.update({"receipt_delay_ms": 20})
    assert f.receipt_delay_ms == 20
    f.reset()
    assert f == Faults()


async def test_faults_settable_over_http(cp: ControlPlane) -> None:
    from tests.controlplane.client import OPERATOR_TOKEN, OTHER_TOKEN, TOKEN, http

    assert cp.http_url is not None
    # A driver's token (even one for every instance) is not the operator's (PROTOCOL §9).
    for driver_token in (TOKEN, OTHER_TOKEN):
        for method, body in (("POST", {"withhold_receipts": True}), ("GET", None)):
            status, _ = await asyncio.to_thread(http, cp.http_url, method, "/api/faults", body, driver_token)
            assert status == 403
    assert cp.faults.withhold_receipts is False
    op = OPERATOR_TOKEN
    status, body = await asyncio.to_thread(http, cp.http_url, "POST", "/api/faults", {"withhold_receipts": True}, op)
    assert status == 200 and body["withhold_receipts"] is True
    assert cp.faults.withhold_receipts is True
    status, body = await asyncio.to_thread(http, cp.http_url, "POST", "/api/faults", {"bogus": 1}, op)
    assert status == 400 and "bogus" in body["error"]
    status, body = await asyncio.to_thread(http, cp.http_url, "POST", "/api/faults", {"reset": True}, op)
    assert status == 200 and cp.faults == Faults()
