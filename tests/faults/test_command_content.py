"""Commands and welcomes that a tolerant reader must take (issue 19 item 6, PROTOCOL §2.2, §3), through
the REAL driver process: a resend with an extra unknown field is the same command (its status is sent
again), a resend differing in a named field is `command.conflict`; a welcome with 0 or negative values
neither makes the link flap nor stops events, and its clamps are logged once per process."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.faults.conftest import Drivers
from tests.faults.link_proxy import LinkProxy
from tests.faults.test_faults import booted, drained_heartbeat, next_heartbeat, status
from tests.faults.test_hostile_link import log_lines
from tests.integration.harness import INSTANCE, DriverProcess, boot_payload, control_plane

pytestmark = pytest.mark.faults


async def updates_after(cp: Any, cid: str, n: int) -> list[dict[str, Any]]:
    """The command's updates once there are more than `n` of them."""
    await cp.wait_until(lambda: len(cp.command_updates(cid)) > n, timeout=10)
    return list(cp.command_updates(cid)[n:])


async def test_resend_with_an_unknown_field_is_the_same_command(tmp_path: Any) -> None:
    async with control_plane(tmp_path) as cp:
        d = DriverProcess(tmp_path, boot_payload(tmp_path, cp.url))
        try:
            await booted(cp)
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": "[[say:one]]"})
            assert (await status(cp, cid, timeout=30))["status"] == "completed"
            body = cp.command(cid)["body"]
            # Extra fields the protocol does not name, at the top and inside `input`, keys reordered,
            # an optional field spelled out with its default.
            extra = {**body, "x_client_hint": {"ui": "console"}, "input": {**body["input"], "x_note": 1}}
            extra["traceparent"] = None
            await drained_heartbeat(cp)  # the status's fact (command.finished) is stored too
            seen = len(cp.command_updates(cid))
            await cp.send_raw(INSTANCE, json.dumps(dict(reversed(list(extra.items())))))
            [again] = await updates_after(cp, cid, seen)
            assert again["status"] == "completed", again
            assert len(cp.events(INSTANCE, kinds="run.started")) == 1  # not executed twice

            # A named field differs: a conflict.
            seen = len(cp.command_updates(cid))
            other = {**body, "input": {**body["input"], "text": "[[say:two]]"}}
            await cp.send_raw(INSTANCE, json.dumps(other))
            [conflict] = await updates_after(cp, cid, seen)
            assert conflict["status"] == "failed"
            assert conflict["error"]["code"] == "command.conflict"

            # The same for a command still running: an unknown field gets `accepted` again.
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-2", input={"text": "[[hang]]"})
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "run.started" and e["run_id"] == "run-2")
            body = cp.command(cid)["body"]
            seen = len(cp.command_updates(cid))
            await cp.send_raw(INSTANCE, json.dumps({**body, "x_retry": 3}))
            [again] = await updates_after(cp, cid, seen)
            assert again["status"] == "accepted", again
            cancel, _ = await cp.send_command(INSTANCE, "turn.cancel", run_id="run-2")
            assert (await status(cp, cid, timeout=30))["status"] == "cancelled"
            assert (await status(cp, cancel, timeout=30))["status"] == "completed"
            assert d.proc.poll() is None
        finally:
            d.close()


BAD_WELCOME = {"heartbeat_interval_ms": 0, "max_batch_events": 0, "max_batch_bytes": -1, "max_event_bytes": 0}


async def test_a_welcome_with_zero_and_negative_values_does_not_flap(tmp_path: Any, drivers: Drivers) -> None:
    async with control_plane(tmp_path) as cp:
        parts = urlsplit(cp.url)
        assert parts.port is not None
        async with LinkProxy(parts.port, ["badwelcome"] * 10) as proxy:
            proxy.welcome_overrides = BAD_WELCOME
            d = drivers.start(f"ws://127.0.0.1:{proxy.port}{parts.path}")
            await booted(cp)
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": "[[say:hi]]"})
            assert (await status(cp, cid, timeout=30))["status"] == "completed"
            # heartbeat_interval_ms 0 means "none given": the protocol's 5 s. The link lives through
            # two of the driver's heartbeats (a driver that took 0 would have dropped it at once).
            await next_heartbeat(cp, timeout=15)
            await next_heartbeat(cp, timeout=15)
            assert len(proxy.connections) == 1
            assert cp.link_history(INSTANCE) == []
            # A reconnect gets the same welcome: its clamps are not logged again.
            assert await cp.close_link(INSTANCE, 1012)
            await proxy.wait_connections(2, timeout=30)
            await cp.wait_connected(INSTANCE, timeout=30)
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-2", input={"text": "[[say:hi]]"})
            assert (await status(cp, cid, timeout=30))["status"] == "completed"
            clamps = [e for e in log_lines(d.stderr()) if e.get("event") == "link.welcome_clamped"]
            assert sorted(c["field"] for c in clamps) == sorted(BAD_WELCOME), clamps
            by_field = {c["field"]: c["used"] for c in clamps}
            assert by_field == {
                "heartbeat_interval_ms": 5_000,
                "max_batch_events": 256,
                "max_batch_bytes": 1_048_576,
                "max_event_bytes": 262_144,
            }
            assert d.proc.poll() is None
