"""The kit's later steps: epochs and 4409, commands and their statuses, liveness.

Where the kit must know that the control plane has handled the frames it sent before (a status it then
reads from the API, a command it must not resend), it sends one probe event and waits for its receipt:
a control plane reads a link's frames in order, so the receipt comes after the earlier frames were read.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from agent_lab.conformance.api import ApiError
from agent_lab.conformance.kit import Kit, Verdict, close_text
from agent_lab.conformance.peer import Frame, Peer
from driver.protocol.commands import CommandInvalid, decode_command


async def epochs(kit: Kit, old: Peer) -> Peer | None:
    """A newer epoch supersedes the current link (4409 to it); an older one is refused with 4409."""
    older = kit.epoch
    new, first = await kit.open(older + 1)
    if first is None or first.get("type") != "welcome":
        kit.say("epoch.supersede", False, f"hello with a newer epoch {older + 1}: {kit.refused(new)}")
        return None
    closed = await old.wait_closed(kit.cfg.timeout)
    kit.say(
        "epoch.supersede",
        closed is not None and closed.code == 4409,
        f"epoch {older + 1} welcomed; the epoch-{older} link was "
        + (close_text(closed.code, closed.reason) if closed else f"still open after {kit.cfg.timeout:g} s"),
    )
    kit.epoch = older + 1
    stale, first = await kit.open(older)
    welcomed = first is not None and first.get("type") == "welcome"
    if not welcomed and stale.closed is None:
        await stale.wait_closed(kit.cfg.timeout)
    refused = not welcomed and stale.closed is not None and stale.closed.code == 4409
    kit.say(
        "epoch.older_refused",
        refused,
        f"hello with the older epoch {older}: " + ("welcomed" if welcomed else kit.refused(stale)),
    )
    kit.say(
        "epoch.current_kept",
        new.closed is None,
        "the current link stayed up" if new.closed is None else f"the current link was {close_text(new.closed.code)}",
    )
    return new


async def round_trip(kit: Kit, p: Peer) -> bool:
    """Whether one probe event was receipted (so every frame sent before it was read)."""
    missing, _ = await kit.deliver(p, kit.new_events(1), rounds=3)
    return not missing


async def status_of(kit: Kit, command_id: str, wanted: str) -> str | None:
    """The command's status once it is `wanted` (polling the API up to the timeout), else the last seen."""
    assert kit.cfg.api is not None
    seen: str | None = None
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(kit.cfg.timeout):
            while seen != wanted:
                seen = (await kit.cfg.api.commands(kit.cfg.instance)).get(command_id, {}).get("status")
                if seen != wanted:
                    await asyncio.sleep(0.1)  # an external API: nothing to wait on but time
    return seen


def update(command_id: str, status: str, **extra: Any) -> Frame:
    return {"type": "command.update", "command_id": command_id, "status": status, **extra}


async def commands(kit: Kit, p: Peer) -> Peer:
    rules = ["commands.delivered", "commands.seq", "commands.status", "commands.finished_event"]
    rules += ["commands.terminal_kept", "commands.replay"]
    if kit.cfg.api is None:
        kit.skip(rules, "no --api: the kit cannot make the control plane send a command")
        return p
    try:
        return await _commands(kit, p)
    except ApiError as exc:
        done = {v.rule for v in kit.verdicts}
        kit.verdicts += [Verdict(r, "FAIL", str(exc)) for r in rules if r not in done]
        return p


async def _posted(kit: Kit, p: Peer, n: int) -> tuple[dict[str, Any], Frame | None]:
    assert kit.cfg.api is not None
    body = {"kind": "turn.cancel", "run_id": f"run-conformance-{kit.epoch}-{n}", "reason": "conformance"}
    posted = await kit.cfg.api.post_command(kit.cfg.instance, body)
    frame = await p.wait_frame(
        lambda f: f.get("type") == "command" and f.get("command_id") == posted["command_id"], kit.cfg.timeout
    )
    return posted, frame


async def _commands(kit: Kit, p: Peer) -> Peer:
    one, frame = await _posted(kit, p, 1)
    problem = "" if frame is not None else f"command {one['command_id']} never arrived within {kit.cfg.timeout:g} s"
    if frame is not None:
        try:
            decode_command(json.dumps(frame))
        except CommandInvalid as exc:
            problem = f"the command frame does not decode: {exc}"
        if frame.get("seq") != one.get("seq"):
            problem = problem or f"the frame's seq {frame.get('seq')} is not the API's {one.get('seq')}"
    kit.say(
        "commands.delivered", not problem, problem or f"{one['command_id']} (seq {one.get('seq')}) sent on the link"
    )
    two, frame2 = await _posted(kit, p, 2)
    kit.say(
        "commands.seq",
        frame2 is not None and frame2.get("seq") == (frame or {}).get("seq", -2) + 1,
        f"seqs {(frame or {}).get('seq')} then {(frame2 or {}).get('seq')}",
    )

    await p.send(update(one["command_id"], "accepted"))
    await p.send(update(one["command_id"], "completed", result={}))
    seen = await status_of(kit, one["command_id"], "completed")
    kit.say("commands.status", seen == "completed", f"accepted then completed by command.update: the API says {seen}")

    await p.send(update(two["command_id"], "accepted"))
    finished = kit.new_events(1)[0]
    finished |= {
        "kind": "command.finished",
        "payload": {
            "command_id": two["command_id"],
            "command_kind": "turn.cancel",
            "status": "completed",
            "result": {},
        },
    }
    missing, note = await kit.deliver(p, [finished])
    seen = await status_of(kit, two["command_id"], "completed") if not missing else note
    kit.say("commands.finished_event", seen == "completed", f"completed by a command.finished event only: {seen}")

    await p.send(update(one["command_id"], "accepted"))  # late, out of order: must not undo the terminal
    await round_trip(kit, p)
    assert kit.cfg.api is not None
    seen = (await kit.cfg.api.commands(kit.cfg.instance)).get(one["command_id"], {}).get("status")
    kit.say("commands.terminal_kept", seen == "completed", f"a late `accepted` after `completed`: the API says {seen}")
    return await _replay(kit, p, one, two)


async def _replay(kit: Kit, p: Peer, one: dict[str, Any], two: dict[str, Any]) -> Peer:
    three, _ = await _posted(kit, p, 3)
    await p.close()
    p, first = await kit.open(kit.epoch, last_command_seq=int(one["seq"]) - 1)
    if first is None or first.get("type") != "welcome":
        kit.say(
            "commands.replay",
            False,
            f"redial: {kit.refused(p)}" if first is None else f"first frame {first.get('type')!r}",
        )
        return p
    again = await p.wait_frame(
        lambda f: f.get("command_id") == three["command_id"] and f.get("type") == "command", kit.cfg.timeout
    )
    await round_trip(kit, p)
    terminal_resent = [
        f["command_id"]
        for f in p.frames
        if f.get("type") == "command" and f.get("command_id") in (one["command_id"], two["command_id"])
    ]
    await p.send(update(three["command_id"], "completed", result={}))
    await round_trip(kit, p)
    await p.close()
    p, first = await kit.open(kit.epoch, last_command_seq=int(three["seq"]))
    await round_trip(kit, p)
    resent_after = [f for f in p.frames if f.get("type") == "command" and f.get("command_id") == three["command_id"]]
    ok = again is not None and not terminal_resent and not resent_after
    kit.say(
        "commands.replay",
        ok,
        "after welcome the unfinished command was sent again, finished ones were not"
        if ok
        else f"unfinished resent: {again is not None}; finished resent: {terminal_resent or bool(resent_after)}",
    )
    return p


async def liveness(kit: Kit, p: Peer) -> None:
    if not kit.cfg.liveness:
        kit.skip(["liveness.heartbeat", "liveness.silence"], "--no-liveness")
        return
    assert kit.welcome is not None
    interval = kit.welcome.heartbeat_interval_ms / 1000
    for _ in range(3):
        await p.heartbeat()
        await p.wait_closed(interval)  # pacing: one heartbeat per interval, as a driver sends them
    kit.say(
        "liveness.heartbeat",
        p.closed is None,
        f"3 heartbeats, one per {interval:g} s: link up"
        if p.closed is None
        else f"{close_text(p.closed.code, p.closed.reason)}",
    )
    if p.closed is not None:
        return
    p.go_silent()
    silent = 4 * interval + 1  # three silent intervals, plus the interval a CP's check may take to notice
    await asyncio.sleep(silent)
    p.wake()
    closed = await p.wait_closed(kit.cfg.timeout + interval)
    kit.say(
        "liveness.silence",
        closed is not None,
        (f"a driver silent for {silent:g} s (no frame, no pong): " + close_text(closed.code, closed.reason))
        if closed
        else f"a driver silent for {silent:g} s and then {kit.cfg.timeout + interval:g} s more is still linked",
    )
