"""The control plane's link behaviour (PROTOCOL §2-§4) against a raw websockets client."""

from __future__ import annotations

import sqlite3

import pytest
from agent_lab.controlplane import ControlPlane
from websockets.exceptions import InvalidStatus

from tests.controlplane.client import (
    INSTANCE,
    OTHER_TOKEN,
    batch,
    close_code,
    dial,
    event,
    handshake,
    hello,
    recv,
    send,
)

# -- dial and handshake -------------------------------------------------------------------------


@pytest.mark.parametrize("token", ["wrong-token-000000", None])
async def test_bad_or_missing_token_is_closed_4401(cp: ControlPlane, token: str | None) -> None:
    ws = await dial(cp.url, token=token)
    assert await close_code(ws) == 4401
    await cp.wait_until(lambda: len(cp.link_history()) == 1)
    assert cp.link_history()[-1]["close_code"] == 4401
    assert not cp.connected(INSTANCE)


async def test_instance_not_allowed_for_token_is_closed_4403(cp: ControlPlane) -> None:
    ws = await dial(cp.url, instance="drv-someone-else")
    assert await close_code(ws) == 4403


async def test_token_for_any_instance_is_accepted(cp: ControlPlane) -> None:
    ws, _ = await handshake(cp.url, instance="drv-anything", token=OTHER_TOKEN)
    assert cp.connected("drv-anything")
    await ws.close()


async def test_missing_subprotocol_is_refused_at_http_level(cp: ControlPlane) -> None:
    with pytest.raises(InvalidStatus) as info:
        await dial(cp.url, subprotocol=False)
    assert info.value.response.status_code == 400


async def test_hello_gets_welcome(cp: ControlPlane) -> None:
    ws, welcome = await handshake(cp.url, epoch=3)
    assert ws.subprotocol == "agent-driver.v1"
    assert welcome["connection_id"].startswith("con-")
    assert welcome["heartbeat_interval_ms"] == 5000
    assert welcome["max_batch_events"] == 256
    assert welcome["max_batch_bytes"] == 1_048_576
    assert welcome["accepted_capabilities"] == ["text_stream"]
    await cp.wait_connected(INSTANCE, timeout=5)
    assert cp.hello(INSTANCE)["epoch"] == 3  # type: ignore[index]
    assert cp.store.highest_epoch(INSTANCE) == 3
    await ws.close()
    await cp.wait_disconnected(INSTANCE, timeout=5)


async def test_first_frame_must_be_hello(cp: ControlPlane) -> None:
    ws = await dial(cp.url)
    await send(ws, {"type": "heartbeat", "at": "x", "state": "ready", "run_id": None, "outbox": {}})
    assert await close_code(ws) == 4400


async def test_hello_naming_another_instance_is_a_protocol_violation(cp: ControlPlane) -> None:
    ws = await dial(cp.url)
    await send(ws, hello(instance="drv-second"))
    assert await close_code(ws) == 4400


async def test_unknown_frame_type_closes_4400(cp: ControlPlane) -> None:
    ws, _ = await handshake(cp.url)
    await send(ws, {"type": "gossip", "text": "hi"})
    assert await close_code(ws) == 4400


async def test_binary_frame_closes_4400(cp: ControlPlane) -> None:
    ws, _ = await handshake(cp.url)
    await ws.send(b'{"type": "heartbeat"}')
    assert await close_code(ws) == 4400


async def test_second_hello_closes_4400(cp: ControlPlane) -> None:
    ws, _ = await handshake(cp.url)
    await send(ws, hello())
    assert await close_code(ws) == 4400


# -- epochs -------------------------------------------------------------------------------------


async def test_lower_epoch_than_seen_is_closed_4409(cp: ControlPlane) -> None:
    ws, _ = await handshake(cp.url, epoch=2)
    await ws.close()
    await cp.wait_disconnected(INSTANCE)
    ws = await dial(cp.url)
    await send(ws, hello(epoch=1))
    assert await close_code(ws) == 4409


async def test_newer_epoch_supersedes_the_older_link(cp: ControlPlane) -> None:
    old, _ = await handshake(cp.url, epoch=1)
    new, _ = await handshake(cp.url, epoch=2)
    assert await close_code(old) == 4409
    assert cp.connected(INSTANCE)
    assert cp.hello(INSTANCE)["epoch"] == 2  # type: ignore[index]
    # The closed old link must not unregister the new one.
    await send(
        new,
        {
            "type": "heartbeat",
            "at": "2026-11-29T10:00:00Z",
            "state": "ready",
            "run_id": None,
            "outbox": {"lossless_pending": 0, "best_effort_dropped": 0},
        },
    )
    await cp.wait_until(lambda: cp.last_heartbeat(INSTANCE) is not None)
    assert cp.connected(INSTANCE)
    await new.close()


async def test_same_epoch_reconnect_supersedes_the_older_connection(cp: ControlPlane) -> None:
    old, _ = await handshake(cp.url, epoch=1)
    new, _ = await handshake(cp.url, epoch=1)
    assert await close_code(old) == 4409
    assert cp.connected(INSTANCE)
    await new.close()


async def test_highest_epoch_survives_a_control_plane_restart(cp: ControlPlane) -> None:
    ws, _ = await handshake(cp.url, epoch=5)
    await cp.restart()
    assert await close_code(ws) == 1012
    ws = await dial(cp.url)
    await send(ws, hello(epoch=4))
    assert await close_code(ws) == 4409
    ws, _ = await handshake(cp.url, epoch=5)
    await ws.close()


async def test_terminate_closes_4410_and_refuses_later_links(cp: ControlPlane) -> None:
    ws, _ = await handshake(cp.url)
    await cp.terminate(INSTANCE)
    assert await close_code(ws) == 4410
    ws = await dial(cp.url)
    await send(ws, hello(epoch=2))
    assert await close_code(ws) == 4410


# -- events and receipts ------------------------------------------------------------------------


async def test_events_are_stored_and_receipted(cp: ControlPlane) -> None:
    ws, _ = await handshake(cp.url)
    events = [event(1), event(2, "message.delta"), event(3, "message.completed")]
    await send(ws, batch(7, events))
    receipt = await recv(ws)
    assert receipt == {"type": "receipt", "batch": 7, "accepted": [e["event_id"] for e in events], "rejected": []}
    stored = cp.events(INSTANCE)
    assert [e["seq"] for e in stored] == [1, 2, 3]
    assert stored[1]["delivery"] == "best_effort"
    assert stored[2]["payload"] == {"message_id": "msg-1", "role": "assistant", "text": "all"}
    assert cp.events(INSTANCE, kinds="message.completed", run_id="run-1")[0]["seq"] == 3
    await ws.close()


async def test_receipt_is_sent_only_after_commit(cp: ControlPlane) -> None:
    ws, _ = await handshake(cp.url)
    events = [event(seq, "message.delta") for seq in range(1, 51)]
    await send(ws, batch(1, events))
    receipt = await recv(ws)
    assert len(receipt["accepted"]) == 50
    # A connection that is not the control plane's sees every receipted row at the receipt's arrival.
    fresh = sqlite3.connect(cp.db_path)
    try:
        ids = {row[0] for row in fresh.execute("SELECT event_id FROM events")}
    finally:
        fresh.close()
    assert set(receipt["accepted"]) <= ids
    await ws.close()


async def test_duplicate_event_is_accepted_again_and_stored_once(cp: ControlPlane) -> None:
    ws, _ = await handshake(cp.url)
    await send(ws, batch(1, [event(1)]))
    assert (await recv(ws))["accepted"] == [event(1)["event_id"]]
    await send(ws, batch(2, [event(1), event(2, "message.completed")]))
    receipt = await recv(ws)
    assert receipt["accepted"] == [event(1)["event_id"], event(2)["event_id"]]
    assert receipt["rejected"] == []
    assert cp.store.count_events(INSTANCE) == 2
    await ws.close()


async def test_same_event_id_with_other_content_is_a_conflict(cp: ControlPlane) -> None:
    ws, _ = await handshake(cp.url)
    await send(ws, batch(1, [event(1)]))
    await recv(ws)
    changed = event(1, payload={"run_id": "run-1", "revision": "rev-2", "input_summary": "other"})
    await send(ws, batch(2, [changed]))
    receipt = await recv(ws)
    assert receipt["accepted"] == []
    assert receipt["rejected"][0]["code"] == "event.conflict"
    assert receipt["rejected"][0]["retryable"] is False
    assert cp.events(INSTANCE)[0]["payload"]["revision"] == "rev-1"
    await ws.close()


@pytest.mark.parametrize(
    ("mutate", "named"),
    [
        (lambda e: e.update(kind="run.exploded"), "unknown event kind"),
        (lambda e: e.pop("seq"), "seq"),
        (lambda e: e.update(delivery="sometimes"), "delivery"),
        (lambda e: e.update(delivery="best_effort"), "must have delivery 'lossless'"),
        (lambda e: e.update(occurred_at="yesterday"), "occurred_at"),
        (lambda e: e["payload"].pop("revision"), "revision"),
        (lambda e: e["payload"].update(surprise=1), "surprise"),
    ],
)
async def test_invalid_event_is_rejected_non_retryable_and_named(cp: ControlPlane, mutate, named: str) -> None:  # type: ignore[no-untyped-def]
    ws, _ = await handshake(cp.url)
    bad = event(2)
    mutate(bad)
    await send(ws, batch(1, [event(1), bad, event(3, "message.completed")]))
    receipt = await recv(ws)
    assert receipt["accepted"] == [event(1)["event_id"], event(3)["event_id"]]
    [rejection] = receipt["rejected"]
    assert rejection["event_id"] == bad["event_id"]
    assert rejection["code"] == "event.invalid"
    assert rejection["retryable"] is False
    assert named in rejection["message"]
    assert [e["seq"] for e in cp.events(INSTANCE)] == [1, 3]
    await ws.close()


async def test_event_without_an_id_is_a_protocol_violation(cp: ControlPlane) -> None:
    ws, _ = await handshake(cp.url)
    await send(ws, batch(1, [{"kind": "run.started"}]))
    assert await close_code(ws) == 4400


async def test_subscribers_see_stored_events_live(cp: ControlPlane) -> None:
    with cp.subscribe(INSTANCE) as sub:
        ws, _ = await handshake(cp.url)
        assert (await sub.get(timeout=5))["state"] == "up"
        await send(ws, batch(1, [event(1), event(2, "message.delta")]))
        first, second = await sub.get(timeout=5), await sub.get(timeout=5)
        assert (first["type"], first["kind"]) == ("event", "run.started")
        assert (second["kind"], second["delivery"], second["payload"]["text"]) == (
            "message.delta",
            "best_effort",
            "chunk 2",
        )
        found = await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "message.delta", timeout=5)
        assert found["seq"] == 2
        await ws.close()
        assert (await sub.get(timeout=5))["state"] == "down"


# -- commands -----------------------------------------------------------------------------------


async def test_command_is_sent_live_and_its_updates_recorded(cp: ControlPlane) -> None:
    ws, _ = await handshake(cp.url)
    command_id, seq = await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": "hi"})
    frame = await recv(ws)
    assert frame == {
        "type": "command",
        "command_id": command_id,
        "seq": seq,
        "kind": "input.start",
        "run_id": "run-1",
        "input": {"text": "hi"},
    }
    assert seq == 1
    await send(ws, {"type": "command.update", "command_id": command_id, "status": "accepted"})
    await cp.wait_for_command_status(command_id, "accepted", timeout=5)
    await send(ws, {"type": "command.update", "command_id": command_id, "status": "completed", "result": {"x": 1}})
    done = await cp.wait_for_command_status(command_id, timeout=5)
    assert (done["status"], done["result"]) == ("completed", {"x": 1})
    # A terminal status is final: a later, different terminal is recorded in the history only.
    err = {"code": "driver.run_active", "message": "busy", "retryable": True}
    await send(ws, {"type": "command.update", "command_id": command_id, "status": "failed", "error": err})
    await cp.wait_until(lambda: len(cp.command_updates(command_id)) == 3)
    assert cp.command(command_id)["status"] == "completed"  # type: ignore[index]
    assert [u["status"] for u in cp.command_updates(command_id)] == ["accepted", "completed", "failed"]
    assert cp.command_updates(command_id)[2]["error"] == err
    await ws.close()


async def test_seq_increases_by_one_per_instance(cp: ControlPlane) -> None:
    seqs = [(await cp.send_command(INSTANCE, "session.reset", reason=str(i)))[1] for i in range(3)]
    other = await cp.send_command("drv-second", "session.reset", reason="x")
    assert seqs == [1, 2, 3]
    assert other[1] == 1


async def test_commands_queued_offline_are_sent_after_welcome(cp: ControlPlane) -> None:
    a, _ = await cp.send_command(INSTANCE, "session.reset", reason="a")
    b, _ = await cp.send_command(INSTANCE, "turn.cancel", run_id="run-1", reason="b")
    ws, _ = await handshake(cp.url)
    assert [(await recv(ws))["command_id"] for _ in range(2)] == [a, b]
    await ws.close()


async def test_replay_after_reconnect_sends_only_non_terminal_commands(cp: ControlPlane) -> None:
    ws, _ = await handshake(cp.url)
    ids = [(await cp.send_command(INSTANCE, "session.reset", reason=str(i)))[0] for i in range(4)]
    for _ in ids:
        await recv(ws)
    await send(ws, {"type": "command.update", "command_id": ids[0], "status": "completed", "result": {}})
    await send(ws, {"type": "command.update", "command_id": ids[1], "status": "accepted"})
    await cp.wait_for_command_status(ids[1], "accepted", timeout=5)
    await cp.wait_for_command_status(ids[0], "completed", timeout=5)
    await ws.close()
    await cp.wait_disconnected(INSTANCE)

    ws, _ = await handshake(cp.url, last_command_seq=0)
    replayed = [(await recv(ws))["command_id"] for _ in range(3)]
    assert replayed == ids[1:]
    await ws.close()
    await cp.wait_disconnected(INSTANCE)

    # last_command_seq bounds the replay from below as well.
    ws, _ = await handshake(cp.url, last_command_seq=3)
    assert (await recv(ws))["command_id"] == ids[3]
    await send(
        ws,
        {
            "type": "heartbeat",
            "at": "2026-11-29T10:00:00Z",
            "state": "ready",
            "run_id": None,
            "outbox": {"lossless_pending": 0, "best_effort_dropped": 0},
        },
    )
    await cp.wait_until(lambda: cp.last_heartbeat(INSTANCE) is not None)
    await ws.close()


async def test_heartbeat_is_recorded(cp: ControlPlane) -> None:
    ws, _ = await handshake(cp.url)
    beat = {
        "type": "heartbeat",
        "at": "2026-11-29T10:00:00Z",
        "state": "running",
        "run_id": "run-9",
        "outbox": {"lossless_pending": 2, "best_effort_dropped": 17},
    }
    with cp.subscribe(INSTANCE) as sub:
        await send(ws, beat)
        seen = await sub.get(timeout=5)
    assert seen["type"] == "heartbeat"
    assert (seen["state"], seen["run_id"], seen["outbox"]["best_effort_dropped"]) == ("running", "run-9", 17)
    assert cp.last_heartbeat(INSTANCE)["state"] == "running"  # type: ignore[index]
    await ws.close()


async def test_silent_peer_is_closed_4408(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tests.controlplane.client import TOKEN

    async with ControlPlane(
        tmp_path / "hb.db", tokens={TOKEN: None}, heartbeat_interval_ms=100, close_timeout_s=0.2
    ) as cp:
        ws, welcome = await handshake(cp.url)
        assert welcome["heartbeat_interval_ms"] == 100
        # Stop reading: our pongs stop, as if the driver hung.
        ws.transport.pause_reading()
        await cp.wait_disconnected(INSTANCE, timeout=5)
        assert cp.link_history(INSTANCE)[-1]["close_code"] == 4408


async def test_responsive_peer_stays_connected_through_pings(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tests.controlplane.client import TOKEN

    async with ControlPlane(tmp_path / "hb.db", tokens={TOKEN: None}, heartbeat_interval_ms=50) as cp:
        ws, _ = await handshake(cp.url)
        # Only pongs (answered by the client library while it waits) keep the link up for 10 intervals.
        with pytest.raises(TimeoutError):
            await recv(ws, timeout=0.5)
        assert cp.connected(INSTANCE)
        await ws.close()


async def test_waits_and_subscriptions_carry_over_a_restart(cp: ControlPlane) -> None:
    ws, _ = await handshake(cp.url, epoch=1)
    with cp.subscribe(INSTANCE) as sub:
        await cp.restart()
        assert await close_code(ws) == 1012
        ws, _ = await handshake(cp.url, epoch=1)
        await cp.wait_connected(INSTANCE, timeout=5)
        states = [(await sub.get(timeout=5))["state"] for _ in range(2)]
        assert states == ["down", "up"]
        await send(ws, batch(1, [event(1)]))
        await cp.wait_for_event(INSTANCE, lambda e: e["seq"] == 1, timeout=5)
    await ws.close()


async def test_history_is_readable_after_stop(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tests.controlplane.client import TOKEN

    async with ControlPlane(tmp_path / "after.db", tokens={TOKEN: None}) as cp:
        ws, _ = await handshake(cp.url)
        await send(ws, batch(1, [event(1)]))
        await recv(ws)
    assert [e["seq"] for e in cp.events(INSTANCE)] == [1]


async def test_tls_link_is_verified_against_the_given_ca(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import ssl

    from tests.controlplane.client import TOKEN, self_signed_cert

    cert, key = self_signed_cert(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    async with ControlPlane(tmp_path / "tls.db", tokens={TOKEN: None}, ssl_context=server_ctx) as cp:
        assert cp.url.startswith("wss://127.0.0.1:")
        with pytest.raises(ssl.SSLCertVerificationError):
            await dial(cp.url, ssl=ssl.create_default_context())
        trusting = ssl.create_default_context(cafile=str(cert))
        ws = await dial(cp.url, ssl=trusting)
        await send(ws, hello())
        assert (await recv(ws))["type"] == "welcome"
        await ws.close()


async def test_pipelined_batches_are_answered_in_order(cp: ControlPlane) -> None:
    ws, _ = await handshake(cp.url)
    for n in range(1, 9):
        await send(ws, batch(n, [event(n, "message.delta")]))
    receipts = [await recv(ws) for _ in range(8)]
    assert [r["batch"] for r in receipts] == list(range(1, 9))
    assert [r["accepted"] for r in receipts] == [[event(n)["event_id"]] for n in range(1, 9)]
    assert cp.store.count_events(INSTANCE) == 8
    await ws.close()


async def test_crash_restart_drops_links_without_a_close_frame(cp: ControlPlane) -> None:
    ws, _ = await handshake(cp.url)
    await send(ws, batch(1, [event(1), event(2, "message.completed")]))
    await recv(ws)
    await cp.restart(1006)
    assert await close_code(ws) is None
    ws, _ = await handshake(cp.url)
    found = await cp.wait_for_event(INSTANCE, lambda e: True, kinds="message.completed", timeout=5)
    assert found["seq"] == 2
    await ws.close()
