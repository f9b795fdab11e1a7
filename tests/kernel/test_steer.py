"""PROTOCOL §3.1 steer through the real driver process.

The tests marked `provider` drive each REAL runtime (Codex app-server, the Claude CLI, codex-acp)
against the fake model endpoints, which record every request: the steered text must be in a model
request made before the run's terminal, and the run's final answer is the model's answer to it. The
others use our stubborn ACP agent (a real process, model-free, fast) for the follow-up mode's edges.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import INSTANCE, boot_payload, control_plane
from tests.kernel import runtimes
from tests.kernel.runtimes import RUNTIMES, Fakes
from tests.kernel.support import Driver, terminals, wait_terminal

MODE = {"claude-agent-sdk": "native", "openai-app-server": "native", "acp:codex-acp": "follow_up"}


def steered_events(cp: Any, run_id: str) -> list[dict[str, Any]]:
    return [e for e in cp.events(INSTANCE, run_id=run_id) if e["kind"] == "input.steered"]


async def steer(cp: Any, run_id: str, text: str, **input_fields: Any) -> str:
    cid, _ = await cp.send_command(INSTANCE, "input.steer", run_id=run_id, input={"text": text, **input_fields})
    return cid


async def first_delta(cp: Any, run_id: str, timeout: float = 60) -> None:
    await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "message.delta" and e["run_id"] == run_id, timeout=timeout)


def mentions(request: dict[str, Any], marker: str) -> bool:
    return marker in json.dumps(request)


@pytest.mark.provider
@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_real_runtime_steer_reaches_a_model_request_before_the_terminal(
    tmp_path: Path, drivers: list[Driver], fakes: Fakes, runtime: str
) -> None:
    marker = f"[[say:steered into {runtime}]]"
    async with control_plane(tmp_path) as cp:
        d = Driver(tmp_path, runtimes.payload(runtime, tmp_path, cp.url, fakes))
        drivers.append(d)
        started = await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=60)
        [cap] = [c for c in started["payload"]["capabilities"] if c["id"] == "steer"]
        assert cap == {"id": "steer", "supported": True, "mode": MODE[runtime]}
        assert {"id": "steer", "supported": True, "mode": MODE[runtime]} in cp.hello(INSTANCE)["capabilities"]

        run_cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-s", input={"text": "[[slow:60]]"})
        await first_delta(cp, "run-s")
        steer_cid = await steer(cp, "run-s", marker)
        status = await cp.wait_for_command_status(steer_cid, timeout=60)
        assert status["status"] == "completed", (status, d.stderr()[-3000:])
        assert status["result"]["mode"] == MODE[runtime]
        terminal = await wait_terminal(cp, "run-s", timeout=90)
        # Snapshot as the terminal arrives: these requests were all made before it.
        before_terminal = fakes.requests(runtime)
        assert terminal["kind"] == "run.completed", terminal
        assert terminal["payload"]["final_message_text"] == f"steered into {runtime}"
        assert any(mentions(r, marker) for r in before_terminal)
        # Every message the run started is completed (one a steer made the provider drop included).
        events = cp.events(INSTANCE, run_id="run-s")
        opened = {e["payload"]["message_id"] for e in events if e["kind"] == "message.started"}
        closed = {e["payload"]["message_id"] for e in events if e["kind"] == "message.completed"}
        assert opened == closed
        [event] = steered_events(cp, "run-s")
        assert event["payload"] == {
            "run_id": "run-s",
            "command_id": steer_cid,
            "text": marker,
            "mode": MODE[runtime],
        }
        assert event["seq"] < terminal["seq"]
        assert (await cp.wait_for_command_status(run_cid, timeout=10))["status"] == "completed"
        assert len(terminals(cp, "run-s")) == 1


@pytest.mark.provider
@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_real_runtime_steer_racing_a_cancel_gives_one_terminal(
    tmp_path: Path, drivers: list[Driver], fakes: Fakes, runtime: str
) -> None:
    async with control_plane(tmp_path) as cp:
        d = Driver(tmp_path, runtimes.payload(runtime, tmp_path, cp.url, fakes))
        drivers.append(d)
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=60)
        await cp.send_command(INSTANCE, "input.start", run_id="run-r", input={"text": runtimes.SLOW})
        await first_delta(cp, "run-r")
        steer_cid = await steer(cp, "run-r", "[[say:too late?]]")
        cancel_cid, _ = await cp.send_command(INSTANCE, "turn.cancel", run_id="run-r", reason="race")
        assert (await cp.wait_for_command_status(cancel_cid, timeout=30))["status"] == "completed"
        status = await cp.wait_for_command_status(steer_cid, timeout=30)
        await wait_terminal(cp, "run-r")
        [terminal] = terminals(cp, "run-r")
        assert terminal["kind"] == "run.cancelled"
        steered = steered_events(cp, "run-r")
        if status["status"] == "completed":
            # It reached the provider first: said before the terminal, never after.
            assert [e["seq"] < terminal["seq"] for e in steered] == [True]
        else:
            assert status["status"] == "cancelled", status
            assert steered == []
        if MODE[runtime] == "follow_up":
            # Held until the prompt ends, which the cancel ends: the cancel always wins.
            assert status["status"] == "cancelled"
        # Whatever the provider kept of a steer it took, nothing of it leaks into the next run.
        nxt, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-next", input={"text": "[[say:next ok]]"})
        assert (await cp.wait_for_command_status(nxt, timeout=60))["status"] == "completed"
        [after] = terminals(cp, "run-next")
        assert after["payload"]["final_message_text"] == "next ok"
        texts = [e["payload"]["text"] for e in cp.events(INSTANCE, "message.completed", run_id="run-next")]
        assert texts == ["next ok"], texts
        assert [e for e in cp.events(INSTANCE) if e["run_id"] is None and e["kind"].startswith("message.")] == []


def stubborn(tmp: Path, url: str, drivers: list[Driver]) -> Driver:
    d = Driver(tmp, boot_payload(tmp, url))
    drivers.append(d)
    return d


async def test_follow_up_steer_runs_one_more_turn_of_the_same_run(tmp_path: Path, drivers: list[Driver]) -> None:
    async with control_plane(tmp_path) as cp:
        d = stubborn(tmp_path, cp.url, drivers)
        run_cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-f", input={"text": "[[compute:1.5]]"})
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "tool.started" and e["run_id"] == "run-f", timeout=20)
        first = await steer(cp, "run-f", "first steer")
        second = await steer(cp, "run-f", "[[echo]]")
        for cid in (first, second):
            status = await cp.wait_for_command_status(cid, timeout=30)
            assert status["status"] == "completed" and status["result"]["mode"] == "follow_up", (
                status.get("error"),
                d.stderr()[-3000:],
            )
        terminal = await wait_terminal(cp, "run-f")
        assert terminal["kind"] == "run.completed"
        # One more turn, carrying both steers in arrival order (the agent echoes its prompt's texts).
        assert terminal["payload"]["final_message_text"] == "first steer\n[[echo]]"
        steered = steered_events(cp, "run-f")
        assert [e["payload"]["command_id"] for e in steered] == [first, second]
        assert all(e["seq"] < terminal["seq"] for e in steered)
        # The first turn's reply came before the steers were delivered (follow-up, not native).
        computed = [e for e in cp.events(INSTANCE, "message.completed", run_id="run-f")]
        assert [e["payload"]["text"] for e in computed] == ["computed", "first steer\n[[echo]]"]
        assert computed[0]["seq"] < steered[0]["seq"] < computed[1]["seq"]
        assert (await cp.wait_for_command_status(run_cid, timeout=10))["status"] == "completed"
        assert len(terminals(cp, "run-f")) == 1


async def test_a_cancel_wins_over_a_held_steer(tmp_path: Path, drivers: list[Driver]) -> None:
    async with control_plane(tmp_path) as cp:
        stubborn(tmp_path, cp.url, drivers)
        run_cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-c", input={"text": "[[slow]]"})
        await first_delta(cp, "run-c", timeout=20)
        steer_cid = await steer(cp, "run-c", "[[say:never]]")
        await cp.wait_for_command_status(steer_cid, "accepted")
        await cp.send_command(INSTANCE, "turn.cancel", run_id="run-c", reason="stop")
        status = await cp.wait_for_command_status(steer_cid, timeout=20)
        assert status["status"] == "cancelled"
        await wait_terminal(cp, "run-c")
        [terminal] = terminals(cp, "run-c")
        assert terminal["kind"] == "run.cancelled"
        assert steered_events(cp, "run-c") == []
        assert (await cp.wait_for_command_status(run_cid, timeout=10))["status"] == "cancelled"


async def test_steer_of_a_run_that_is_not_active_fails_run_not_active(tmp_path: Path, drivers: list[Driver]) -> None:
    async with control_plane(tmp_path) as cp:
        stubborn(tmp_path, cp.url, drivers)
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=20)
        # No run at all.
        cid = await steer(cp, "run-none", "hello?")
        status = await cp.wait_for_command_status(cid, timeout=10)
        assert status["status"] == "failed" and status["error"]["code"] == "run.not_active"
        # A run that is over.
        done, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-d", input={"text": "[[say:done]]"})
        await cp.wait_for_command_status(done, timeout=20)
        cid = await steer(cp, "run-d", "too late")
        assert (await cp.wait_for_command_status(cid, timeout=10))["error"]["code"] == "run.not_active"
        # A queued run (it is not active yet) and another run than the active one.
        await cp.send_command(INSTANCE, "input.start", run_id="run-a", input={"text": "[[slow]]"})
        await first_delta(cp, "run-a", timeout=20)
        await cp.send_command(INSTANCE, "input.start", run_id="run-q", input={"text": "hi"}, queue=True)
        for run_id in ("run-q", "run-other"):
            cid = await steer(cp, run_id, "hi")
            status = await cp.wait_for_command_status(cid, timeout=10)
            assert status["status"] == "failed" and status["error"]["code"] == "run.not_active", status
        assert steered_events(cp, "run-a") == []
        # A steer without text is invalid, like an input.start without one.
        bad, _ = await cp.send_command(INSTANCE, "input.steer", run_id="run-a", input={})
        assert (await cp.wait_for_command_status(bad, timeout=10))["error"]["code"] == "command.invalid"


async def test_a_steer_carries_attachments_like_input_start(tmp_path: Path, drivers: list[Driver]) -> None:
    source = tmp_path / "notes.txt"
    source.write_bytes(b"steered file")
    attachment = {
        "name": "steer-notes.txt",
        "url": source.as_uri(),
        "sha256": hashlib.sha256(b"steered file").hexdigest(),
        "size": 12,
    }
    async with control_plane(tmp_path) as cp:
        stubborn(tmp_path, cp.url, drivers)
        await cp.send_command(INSTANCE, "input.start", run_id="run-att", input={"text": "[[compute:1]]"})
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "tool.started", timeout=20)
        cid = await steer(cp, "run-att", "[[echo]]", attachments=[attachment])
        assert (await cp.wait_for_command_status(cid, timeout=30))["status"] == "completed"
        terminal = await wait_terminal(cp, "run-att")
        final = terminal["payload"]["final_message_text"]
        cwd = tmp_path / "cwd"
        assert (cwd / "inputs" / "steer-notes.txt").read_bytes() == b"steered file"
        assert "inputs/steer-notes.txt" in final
        assert f"[resource_link] {(cwd / 'inputs' / 'steer-notes.txt').as_uri()}" in final


async def test_steered_text_joins_the_transcript_a_fresh_session_is_given(
    tmp_path: Path, drivers: list[Driver]
) -> None:
    from tests.kernel.test_continuity import FAST, kill_provider_while_idle

    async with control_plane(tmp_path) as cp:
        payload = boot_payload(tmp_path, cp.url)
        payload["execution"]["acp"]["env"] = {"STUBBORN_LOAD_SESSION": "0"}  # it forgets sessions when it dies
        d = Driver(tmp_path, payload, env=FAST)
        drivers.append(d)
        await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": "[[compute:1]]"})
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "tool.started", timeout=20)
        cid = await steer(cp, "run-1", "also remember PELICAN")
        assert (await cp.wait_for_command_status(cid, timeout=30))["status"] == "completed"
        await wait_terminal(cp, "run-1")
        await kill_provider_while_idle(cp, d)
        done, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-2", input={"text": "[[echo]]"})
        await cp.wait_for_command_status(done, timeout=60)
        replayed = (await wait_terminal(cp, "run-2"))["payload"]["final_message_text"]
        assert "user: also remember PELICAN" in replayed, replayed


async def test_a_steer_waits_for_a_provider_still_starting_and_a_cancel_ends_it(
    tmp_path: Path, drivers: list[Driver]
) -> None:
    async with control_plane(tmp_path) as cp:
        env = {"AGENT_DRIVER_PROVIDER_START_TIMEOUT_MS": "30000"}
        d = Driver(tmp_path, boot_payload(tmp_path, cp.url, mode="no-init"), env=env)  # never answers initialize
        drivers.append(d)
        await cp.send_command(INSTANCE, "input.start", run_id="run-w", input={"text": "hi"})
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "run.started" and e["run_id"] == "run-w")
        steer_cid = await steer(cp, "run-w", "while it starts")
        await cp.wait_for_command_status(steer_cid, "accepted")
        # Held for the turn: not refused, not delivered (there is no provider to take it yet).
        assert cp.command(steer_cid)["status"] == "accepted"
        await cp.send_command(INSTANCE, "turn.cancel", run_id="run-w", reason="give up")
        status = await cp.wait_for_command_status(steer_cid, timeout=20)
        assert status["status"] == "cancelled", status
        assert (await wait_terminal(cp, "run-w"))["kind"] == "run.cancelled"
        assert steered_events(cp, "run-w") == []


async def test_a_steer_after_the_cancel_was_asked_ends_cancelled(tmp_path: Path, drivers: list[Driver]) -> None:
    async with control_plane(tmp_path) as cp:
        # The stubborn agent ignoring the cancel keeps the run active (cancel asked) for the grace.
        payload = boot_payload(tmp_path, cp.url, mode="ignore-cancel")
        d = Driver(tmp_path, payload, env={"AGENT_DRIVER_CANCEL_GRACE_MS": "3000"})
        drivers.append(d)
        await cp.send_command(INSTANCE, "input.start", run_id="run-x", input={"text": "[[slow]]"})
        await first_delta(cp, "run-x", timeout=20)
        cancel, _ = await cp.send_command(INSTANCE, "turn.cancel", run_id="run-x", reason="stop")
        await cp.wait_for_command_status(cancel, "accepted")
        steer_cid = await steer(cp, "run-x", "[[say:after the cancel]]")
        status = await cp.wait_for_command_status(steer_cid, timeout=20)
        assert status["status"] == "cancelled", status
        assert (await wait_terminal(cp, "run-x"))["kind"] == "run.cancelled"
        assert steered_events(cp, "run-x") == []
