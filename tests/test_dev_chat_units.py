"""The dev chat's parts without a driver: typed lines, the permission prompts, the runs it follows."""

from __future__ import annotations

from agent_lab.dev import typed
from agent_lab.dev.asking import Asking
from agent_lab.dev.follow import Following, new_run


def test_typed_lines_commands_queue_and_words() -> None:
    assert typed.parse("/status\n") == typed.Typed("status")
    assert typed.parse("/link") == typed.Typed("link")  # a fresh console login link
    assert typed.parse("  /exit  ") == typed.Typed("quit")
    assert typed.parse("/queue  then this \r\n") == typed.Typed("queue", "then this")
    assert typed.parse("/queue") == typed.Typed("queue", "")
    assert typed.parse("  hello there \n") == typed.Typed("say", "  hello there ")  # as typed, its Enter cut
    assert typed.parse(" \n") == typed.Typed("empty")
    assert [typed.answer(a) for a in ("y\n", " YES ", "n", "No", "maybe", "")] == [True, True, False, False, None, None]


def _request(request_id: str) -> dict[str, object]:
    options = [
        {"option_id": f"{request_id}-a", "kind": "allow_once"},
        {"option_id": f"{request_id}-r", "kind": "reject_once"},
    ]
    return {"request_id": request_id, "options": options}


def test_permission_prompts_are_asked_one_at_a_time_and_settled_from_elsewhere() -> None:
    asking = Asking()
    assert not asking
    assert asking.add(_request("p1")) is True  # the first is asked at once
    assert asking.add(_request("p2")) is False and asking.add(_request("p3")) is False
    # The console answered the one being asked: say so, and ask the next.
    settled = asking.settle({"request_id": "p1", "decided_by": "control_plane", "outcome": "allowed"})
    assert (settled.from_console, settled.ask_next) == (True, True) and asking.head()["request_id"] == "p2"
    # A later one timed out: nothing to say, the one being asked stays.
    assert asking.settle({"request_id": "p3", "decided_by": "timeout"}) == type(settled)(False, False)
    request, option = asking.take(False)
    assert (request["request_id"], option) == ("p2", "p2-r") and not asking


def test_a_queued_run_that_ends_before_it_is_followed_ends_at_once_when_followed() -> None:
    follow = Following()
    follow.run, queued = new_run(), new_run()
    follow.queued.append(queued)
    assert follow.terminal(queued.run_id, "run.completed") is False  # kept for later
    assert follow.terminal(follow.run.run_id, "run.cancelled") is True and follow.run.terminal_seen
    assert follow.follow_next() == "run.completed" and follow.run is queued and queued.terminal_seen
    assert follow.refused(queued.command_id) is None  # its terminal already told the story
    refused_queued = new_run()
    follow.queued.append(refused_queued)
    assert follow.refused(refused_queued.command_id) == "queued" and not follow.queued
