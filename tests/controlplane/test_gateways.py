"""Several gateways (in-process `ControlPlane`s) over one PostgreSQL database (issue 34): a takeover on
another gateway closes the old link 4409; a batch racing a takeover stores nothing once the takeover
committed; a command stored anywhere reaches the link wherever it is, during a takeover too; a
termination on one gateway closes the link on another 4410; handshakes beyond the cap get 1013."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from agent_lab.controlplane import ControlPlane
from websockets.asyncio.client import ClientConnection

from tests.controlplane.client import INSTANCE, TOKEN, batch, close_code, dial, event, handshake, recv, send


def gateway(url: str, name: str, **kw: Any) -> ControlPlane:
    return ControlPlane(url, gateway_id=name, tokens={TOKEN: None}, http_port=None, close_timeout_s=1.0, **kw)


@pytest.fixture
async def pair(pg_url: str) -> AsyncIterator[tuple[ControlPlane, ControlPlane]]:
    async with gateway(pg_url, "gw-a") as a, gateway(pg_url, "gw-b") as b:
        yield a, b


async def frames_until_command(ws: ClientConnection, command_id: str) -> list[dict[str, Any]]:
    """Frames read until the command arrives, then for a short while more (a second copy would be here)."""
    seen: list[dict[str, Any]] = []
    while not any(f.get("command_id") == command_id for f in seen):
        seen.append(await recv(ws))
    try:
        while True:
            seen.append(await recv(ws, timeout=0.3))
    except TimeoutError:
        return seen


async def test_a_link_that_dials_another_gateway_takes_over_and_the_old_one_is_closed_4409(
    pair: tuple[ControlPlane, ControlPlane],
) -> None:
    a, b = pair
    old, _ = await handshake(a.url)
    await send(old, batch(1, [event(1)]))
    assert (await recv(old))["accepted"] == [event(1)["event_id"]]
    new, _ = await handshake(b.url)  # the same driver (same epoch) redialled the other gateway
    assert await close_code(old) == 4409
    await send(new, batch(1, [event(1), event(2, "message.completed")]))
    receipt = await recv(new)
    assert receipt["accepted"] == [event(1)["event_id"], event(2, "message.completed")["event_id"]]
    assert b.store.count_events(INSTANCE) == 2 and a.store.count_events(INSTANCE) == 2  # stored once
    assert a.store.link_generation(INSTANCE) == 2


# Alone (serial): it failed twice among 4 parallel workers (the batch was never seen waiting on the
# takeover's row lock) and passed every time alone (5 runs); the cause under load is not found yet.
@pytest.mark.serial
async def test_a_batch_against_a_takeover_stores_nothing_once_the_takeover_commits(
    pair: tuple[ControlPlane, ControlPlane], pg_url: str
) -> None:
    """Deterministic: the takeover's UPDATE is held open in a transaction of its own; the old link's
    batch waits for it on the instance row (FOR SHARE), and once the takeover commits it is refused."""
    a, _ = pair
    old, _ = await handshake(a.url)
    takeover = await asyncpg.connect(pg_url)
    try:
        tx = takeover.transaction()
        await tx.start()
        await takeover.execute(
            "UPDATE instances SET link_generation = link_generation + 1 WHERE instance_id = $1", INSTANCE
        )
        await send(old, batch(1, [event(1)]))
        async with asyncio.timeout(30):  # the batch's transaction is now waiting on the row lock
            # The database tells no event for "a backend waits on a lock": its view is polled.
            while not await takeover.fetchval(  # noqa: ASYNC110
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%FOR SHARE%'"
            ):
                await asyncio.sleep(0.02)
        await tx.commit()
    finally:
        await takeover.close()
    assert await close_code(old) == 4409  # no receipt came before the close
    assert a.store.count_events(INSTANCE) == 0


@pytest.mark.parametrize("when", ["before_dial", "with_dial", "after_welcome"])
async def test_a_command_during_a_takeover_reaches_the_new_link_once(
    pair: tuple[ControlPlane, ControlPlane], when: str
) -> None:
    a, b = pair
    old, _ = await handshake(a.url)
    cid = "cmd-during"

    async def command() -> None:
        await a.send_command(INSTANCE, "session.reset", command_id=cid)  # stored by the OLD link's gateway

    if when == "before_dial":
        await command()
        new, _ = await handshake(b.url)
    elif when == "with_dial":
        (new, _), _ = await asyncio.gather(handshake(b.url), command())
    else:
        new, _ = await handshake(b.url)
        await close_code(old)
        await command()
    seen = await frames_until_command(new, cid)
    assert [f["command_id"] for f in seen if f.get("type") == "command"] == [cid]
    assert await close_code(old) == 4409
    assert b.store.command(cid)["status"] == "pending"  # type: ignore[index]


async def test_a_command_queued_on_one_gateway_is_sent_by_the_gateway_holding_the_link(
    pair: tuple[ControlPlane, ControlPlane],
) -> None:
    a, b = pair
    ws, _ = await handshake(a.url)
    cid, seq = await b.send_command(INSTANCE, "session.reset")
    frame = await recv(ws)
    assert (frame["type"], frame["command_id"], frame["seq"]) == ("command", cid, seq)
    await send(ws, {"type": "command.update", "command_id": cid, "status": "completed", "result": {}})
    await a.wait_for_command_status(cid, "completed")
    assert b.store.command(cid)["status"] == "completed"  # type: ignore[index]  # readable from every gateway
    await b.terminate(INSTANCE)
    assert await close_code(ws) == 4410  # closed by the gateway that holds it


async def test_handshakes_beyond_the_cap_are_told_to_try_later(pg_url: str) -> None:
    async with gateway(pg_url, "gw-c", max_handshakes=1) as cp:
        first = await dial(cp.url)  # accepted, no hello yet: one handshake in flight
        second = await dial(cp.url)
        assert await close_code(second) == 1013
        await send(first, {"type": "hello", "protocol": 1})  # not a whole hello: 4400, the slot frees
        assert await close_code(first) == 4400
        ws, _ = await handshake(cp.url)
        assert cp.refused_busy == 1
        await ws.close()


def test_gateways_share_one_console_token_file(tmp_path: Path) -> None:
    """`controlplane gateways N` gives every gateway the same console token file (created once, before
    the children start), so a console session cookie issued by one gateway verifies at every other."""
    from agent_lab.controlplane.console.sessions import Sessions
    from agent_lab.controlplane.gateways import gateway_argv, shared_token_files

    args = shared_token_files(["--token-file", str(tmp_path / "cp.token"), "--port", "9"])
    console_file = tmp_path / "console.token"
    assert args[-2:] == ["--console-token-file", str(console_file)]
    token = console_file.read_text().strip()
    assert token and (console_file.stat().st_mode & 0o777) == 0o600
    argvs = [gateway_argv("postgresql://x/y", i, args) for i in (1, 2)]
    assert all(a[a.index("--console-token-file") + 1] == str(console_file) for a in argvs)
    cookie = Sessions(token).issue(8766)
    assert Sessions(console_file.read_text().strip()).valid(cookie, 8766)
    given = tmp_path / "mine.token"
    again = shared_token_files(["--token-file", str(tmp_path / "cp.token"), "--console-token-file", str(given)])
    assert again.count("--console-token-file") == 1 and given.exists()
