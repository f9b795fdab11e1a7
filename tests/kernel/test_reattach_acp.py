"""PROTOCOL §8.2 for ACP agents, through real driver processes, the REAL ACP agents from node_modules
(codex-acp, claude-agent-acp) against the fake model endpoints, and the reference control plane: with
`execution.reattach_grace_ms`, a driver SIGKILLed mid-stream is replaced by a new process on the same
`state_dir`, and the run in flight ends with its own terminal (the answer to the dead driver's
`session/prompt`), its text whole, its lossless events stored once, the same agent process, and no
second request to the model. The Codex app-server's are in tests/kernel/test_reattach.py (reused here).
"""

from __future__ import annotations

import itertools
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest
from agent_lab.testing.script import SLOW_TEXT

from driver.keeper import kept
from driver.keeper import state as keeper_state
from tests.faults.history import check_instance, check_run
from tests.integration.harness import INSTANCE, DriverProcess, control_plane
from tests.kernel import runtimes
from tests.kernel.runtimes import Fakes
from tests.kernel.support import Driver
from tests.kernel.test_checkpoints import boot_payload
from tests.kernel.test_reattach import (
    FAST,
    LONG,
    alive,
    assert_whole_run,
    driver_key,
    provider_pid,
    runtimes_slow_text,
    wait_word,
)

__all__ = ["driver_key"]  # the autouse fixture: the keeper's files are read under the journal's key

AGENTS = ("acp:codex-acp", "acp:claude-agent-acp")
# What each agent's fake model answers with a file write that asks for a permission first.
PERMISSION = {"acp:codex-acp": "[[write:notes.txt:hello]]", "acp:claude-agent-acp": "[[write:notes.txt:hello]]"}
# Run-scoped lossless kinds and the payload field that names what each is about: none may be stored twice.
IDENTITY = {
    "message.started": "message_id",
    "message.completed": "message_id",
    "thought.started": "thought_id",
    "thought.completed": "thought_id",
    "tool.started": "tool_call_id",
    "tool.completed": "tool_call_id",
}
STATE_KINDS = ("session.mode.updated", "session.config.updated", "session.commands.updated")


def kept_payload(agent: str, tmp: Path, cp: Any, fakes: Fakes, grace_ms: int = 30_000) -> dict[str, Any]:
    payload = boot_payload(agent, tmp, cp.url, fakes)
    payload["execution"]["reattach_grace_ms"] = grace_ms
    return payload


def fake_of(fakes: Fakes, agent: str) -> Any:
    return fakes.anthropic if "claude" in agent else fakes.responses


def agent_loop_requests(fakes: Fakes, agent: str) -> int:
    """Model requests that offer tools (Claude Code also sends tool-less side requests: a title)."""
    return sum(1 for r in fake_of(fakes, agent).requests if r.get("tools"))


def conversations(fakes: Fakes, agent: str) -> list[str]:
    """What each model request carried (its messages or input items), in order."""
    return [json.dumps(r.get("messages", r.get("input")), sort_keys=True) for r in fake_of(fakes, agent).requests]


def assert_once(cp: Any, run_id: str) -> None:
    """No run event stored twice (by what it is about), and no session state snapshot equal to the one
    before it (a snapshot is sent only when it changes: one sent twice was replayed)."""
    events = cp.events(INSTANCE, run_id=run_id)
    seen = Counter((e["kind"], e["payload"][IDENTITY[e["kind"]]]) for e in events if e["kind"] in IDENTITY)
    assert not [k for k, n in seen.items() if n > 1], seen
    for kind in STATE_KINDS:
        snapshots = [json.dumps(e["payload"], sort_keys=True) for e in cp.events(INSTANCE) if e["kind"] == kind]
        assert all(a != b for a, b in itertools.pairwise(snapshots)), f"{kind} sent twice"


async def kill_and_replace(d: Driver, cp: Any, tmp: Path, payload: dict[str, Any], n: int) -> Driver:
    d.kill()
    await cp.wait_disconnected(INSTANCE, timeout=10)
    return Driver(tmp, payload, name=f"driver{n + 2}", env=FAST)


@pytest.mark.provider
@pytest.mark.parametrize("agent", AGENTS)
async def test_driver_killed_mid_stream_the_acp_run_continues(agent: str, tmp_path: Path, fakes: Fakes) -> None:
    """Two kills in one run: the first is the one-kill case (each step checked in the loop; a run
    ending after one reattach is the other reattach tests' case), the second a successor's successor."""
    kills = 2
    state = tmp_path / "state"
    async with control_plane(tmp_path) as cp:
        d = Driver(tmp_path, kept_payload(agent, tmp_path, cp, fakes), env=FAST)
        try:
            started = await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=90)
            assert {c["id"]: c["supported"] for c in started["payload"]["capabilities"]}["reattach"] is True
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": LONG})
            pid = None
            asked = 0
            for n in range(kills):
                await wait_word(cp, "run-1", 40 * (n + 1), timeout=90)
                pid = provider_pid(state) if pid is None else pid
                asked = agent_loop_requests(fakes, agent)
                t0 = time.monotonic()
                d = await kill_and_replace(d, cp, tmp_path, kept_payload(agent, tmp_path, cp, fakes), n)
                assert alive(pid), "the agent died with its driver"
                epoch = n + 2
                await cp.wait_for_event(
                    INSTANCE, lambda e, epoch=epoch: e["run_id"] == "run-1" and e["epoch"] == epoch, timeout=60
                )
                print(f"{agent} reattach: first event of the continued run {1000 * (time.monotonic() - t0):.0f} ms")
                assert provider_pid(state) == pid, "not the same agent process"
            status = await cp.wait_for_command_status(cid, timeout=120)
            assert status["status"] == "completed", status
            term = assert_whole_run(cp, "run-1")
            assert term["epoch"] == kills + 1
            started = [e for e in cp.events(INSTANCE, run_id="run-1") if e["kind"] == "message.started"]
            assert len(started) == 1 and started[0]["epoch"] == 1, started
            assert agent_loop_requests(fakes, agent) == asked, "the model was asked again"
            assert not [e for e in cp.events(INSTANCE) if e["kind"] == "run.failed"]
            assert_once(cp, "run-1")
            check_instance(cp)
            # The agent goes on serving runs after the reattach, in the same session.
            sessions = {e["payload"]["value"] for e in cp.events(INSTANCE) if e["kind"] == "runtime.resume.updated"}
            assert len(sessions) == 1, sessions
            cid2, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-2", input={"text": "[[say:ok]]"})
            assert (await cp.wait_for_command_status(cid2, timeout=90))["status"] == "completed"
            check_run(cp, "run-2", terminal="run.completed")
            assert provider_pid(state) == pid
        finally:
            d.close()
            kept.discard(state)


@pytest.mark.provider
@pytest.mark.parametrize("agent", AGENTS)
async def test_an_acp_permission_pending_across_the_kill_is_answered(agent: str, tmp_path: Path, fakes: Fakes) -> None:
    state = tmp_path / "state"
    async with control_plane(tmp_path) as cp:
        d = Driver(tmp_path, kept_payload(agent, tmp_path, cp, fakes), env=FAST)
        try:
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=90)
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": PERMISSION[agent]})
            first = await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "permission.requested", timeout=90)
            pid = provider_pid(state)
            before = conversations(fakes, agent)
            d = await kill_and_replace(d, cp, tmp_path, kept_payload(agent, tmp_path, cp, fakes), 0)
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started" and e["epoch"] == 2, timeout=90)
            # The request the dead driver never answered keeps its request_id: the CP answers the one
            # it saw, and the new process announces nothing twice (driver/queue/asked.py).
            allow = next(o["option_id"] for o in first["payload"]["options"] if o["kind"] == "allow_once")
            resolve, _ = await cp.send_command(
                INSTANCE, "permission.resolve", request_id=first["payload"]["request_id"], option_id=allow
            )
            assert (await cp.wait_for_command_status(resolve, timeout=60))["status"] == "completed"
            status = await cp.wait_for_command_status(cid, timeout=120)
            assert status["status"] == "completed", status
            assert (tmp_path / "cwd" / "notes.txt").read_text().strip() == "hello", "the approved write did not run"
            check_run(cp, "run-1", terminal="run.completed")
            assert_once(cp, "run-1")
            tool = [e for e in cp.events(INSTANCE, run_id="run-1") if e["kind"] == "tool.completed"]
            assert [e["payload"]["status"] for e in tool] == ["completed"], tool
            assert provider_pid(state) == pid
            # After the kill the model is asked on (the tool's result), never the same thing again.
            after = conversations(fakes, agent)[len(before) :]
            assert after and not set(after) & set(before), "the model was asked again"
            requested = [e["payload"]["request_id"] for e in cp.events(INSTANCE, "permission.requested")]
            assert requested == [first["payload"]["request_id"]], "a request was announced twice"
            decided = [
                (e["payload"]["request_id"], e["payload"]["outcome"])
                for e in cp.events(INSTANCE, "permission.resolved")
            ]
            assert decided == [(requested[0], "allowed")]
        finally:
            d.close()
            kept.discard(state)


# How each agent's fake model is told to call the host tool `lookup`.
HOST_CALL = {
    "acp:codex-acp": '[[mcp:host:lookup:{"q": "teal"}]]',
    "acp:claude-agent-acp": '[[tool:mcp__host__lookup:{"q": "teal"}]]',
}


@pytest.mark.provider
@pytest.mark.parametrize("agent", AGENTS)
async def test_the_continued_acp_session_calls_host_tools_at_the_address_it_was_given(
    agent: str, tmp_path: Path, fakes: Fakes
) -> None:
    """The agent's open session keeps the host MCP server's URL and token of its session/new: the new
    driver serves them (driver/adapters/common/host_server.py), so a host tool called after the reattach
    reaches the CP."""
    state = tmp_path / "state"
    schema = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}

    def payload() -> dict[str, Any]:
        p = kept_payload(agent, tmp_path, cp, fakes)
        p["execution"]["host_tools"] = [{"name": "lookup", "description": "Look a thing up", "input_schema": schema}]
        p["execution"]["permission_policy"] = "full_access"
        return p

    async with control_plane(tmp_path) as cp:
        d = Driver(tmp_path, payload(), env=FAST)
        try:
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=90)
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": LONG})
            await wait_word(cp, "run-1", 40, timeout=90)
            pid = provider_pid(state)
            d = await kill_and_replace(d, cp, tmp_path, payload(), 0)
            assert (await cp.wait_for_command_status(cid, timeout=120))["status"] == "completed"
            cid2, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-2", input={"text": HOST_CALL[agent]})
            called = await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "host_tool.called", timeout=90)
            assert called["epoch"] == 2 and called["payload"]["name"] == "lookup"
            await cp.send_command(
                INSTANCE,
                "host_tool.result",
                call_id=called["payload"]["call_id"],
                content=[{"type": "text", "text": "teal is a colour"}],
                is_error=False,
            )
            assert (await cp.wait_for_command_status(cid2, timeout=120))["status"] == "completed"
            resolved = [e["payload"] for e in cp.events(INSTANCE, "host_tool.resolved")]
            assert resolved == [{"call_id": called["payload"]["call_id"], "outcome": "completed"}]
            assert provider_pid(state) == pid
        finally:
            d.close()
            kept.discard(state)


def stubborn_payload(tmp: Path, cp: Any, fakes: Fakes) -> dict[str, Any]:
    """Our scripted ACP agent (lab/agent_lab/testing/agents): it can ask, write or run a terminal and
    then stream for ~20 s in one prompt, which no fake model scripts."""
    payload = runtimes.payload("acp:stubborn", tmp, cp.url, fakes)
    payload["execution"]["reattach_grace_ms"] = 30_000
    return payload


@pytest.mark.provider
@pytest.mark.parametrize("answer", ["allow_once", "reject_once"])
async def test_an_answered_permission_is_not_asked_again(answer: str, tmp_path: Path, fakes: Fakes) -> None:
    """Killed after the permission was answered: the new driver derives the tool's events again from
    the log (a rejection included: the tool ends `declined` once), and neither answers the agent again
    nor asks the control plane again."""
    state = tmp_path / "state"
    async with control_plane(tmp_path) as cp:
        d = Driver(tmp_path, stubborn_payload(tmp_path, cp, fakes), env=FAST)
        try:
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=60)
            text = f"[[perm]] {LONG}"
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": text})
            asked = await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "permission.requested", timeout=60)
            option = next(o["option_id"] for o in asked["payload"]["options"] if o["kind"] == answer)
            await cp.send_command(
                INSTANCE, "permission.resolve", request_id=asked["payload"]["request_id"], option_id=option
            )
            await wait_word(cp, "run-1", 40)
            pid = provider_pid(state)
            d = await kill_and_replace(d, cp, tmp_path, stubborn_payload(tmp_path, cp, fakes), 0)
            status = await cp.wait_for_command_status(cid, timeout=90)
            assert status["status"] == "completed", status
            assert [e["epoch"] for e in cp.events(INSTANCE) if e["kind"] == "permission.requested"] == [1]
            assert_whole_run(cp, "run-1")
            assert_once(cp, "run-1")
            tools = [e for e in cp.events(INSTANCE, run_id="run-1") if e["kind"] == "tool.completed"]
            wanted = "completed" if answer == "allow_once" else "declined"
            assert [e["payload"]["status"] for e in tools] == [wanted], tools
            assert provider_pid(state) == pid
        finally:
            d.close()
            kept.discard(state)


@pytest.mark.provider
async def test_an_answered_file_write_is_not_done_again(tmp_path: Path, fakes: Fakes) -> None:
    """`fs/write_text_file` answered before the kill: its `file.changed` is stored once, and the new
    driver does not write the file again (the agent's later content stays)."""
    state = tmp_path / "state"
    async with control_plane(tmp_path) as cp:
        d = Driver(tmp_path, stubborn_payload(tmp_path, cp, fakes), env=FAST)
        try:
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=60)
            text = f"[[write:notes.txt:hello]] {LONG}"
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": text})
            await wait_word(cp, "run-1", 40)
            target = tmp_path / "cwd" / "notes.txt"
            target.write_text("changed since")  # a write done again would put "hello" back
            d = await kill_and_replace(d, cp, tmp_path, stubborn_payload(tmp_path, cp, fakes), 0)
            status = await cp.wait_for_command_status(cid, timeout=90)
            assert status["status"] == "completed", status
            assert_whole_run(cp, "run-1")
            assert_once(cp, "run-1")
            changed = [e for e in cp.events(INSTANCE, run_id="run-1") if e["kind"] == "file.changed"]
            assert [(e["payload"]["path"], e["epoch"]) for e in changed] == [("notes.txt", 1)], changed
            assert target.read_text() == "changed since"
        finally:
            d.close()
            kept.discard(state)


def running(needle: str) -> list[int]:
    """Pids whose command line holds `needle`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.mark.provider
async def test_a_terminal_of_the_dead_driver_is_gone_and_its_wait_fails_cleanly(tmp_path: Path, fakes: Fakes) -> None:
    """ACP terminals are the driver's: they end with it. The agent's `terminal/wait_for_exit`, pending
    across the kill, is answered by the new driver with an error naming the unknown terminal, and the
    run ends with its own terminal."""
    state = tmp_path / "state"
    command = "sleep 47.25"
    async with control_plane(tmp_path) as cp:
        d = Driver(tmp_path, stubborn_payload(tmp_path, cp, fakes), env=FAST)
        try:
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=60)
            text = f"[[term:{command}]]"
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": text})
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "tool.started", timeout=60)
            assert running(command), "the terminal did not start"
            pid = provider_pid(state)
            d = await kill_and_replace(d, cp, tmp_path, stubborn_payload(tmp_path, cp, fakes), 0)
            status = await cp.wait_for_command_status(cid, timeout=60)
            assert status["status"] == "completed", status
            term = check_run(cp, "run-1", terminal="run.completed")
            assert "terminal error" in term["payload"]["final_message_text"], term["payload"]
            assert "unknown terminal" in term["payload"]["final_message_text"], term["payload"]
            assert not running(command), "a terminal outlived its driver"
            assert_once(cp, "run-1")
            tools = [e for e in cp.events(INSTANCE, run_id="run-1") if e["kind"] == "tool.completed"]
            assert [e["payload"]["status"] for e in tools] == ["failed"], tools
            assert provider_pid(state) == pid
        finally:
            d.close()
            kept.discard(state)


@pytest.mark.provider
async def test_an_idle_acp_agent_is_reattached(tmp_path: Path, fakes: Fakes) -> None:
    agent = "acp:codex-acp"
    state = tmp_path / "state"
    async with control_plane(tmp_path) as cp:
        d = Driver(tmp_path, kept_payload(agent, tmp_path, cp, fakes), env=FAST)
        try:
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": "[[say:first]]"})
            assert (await cp.wait_for_command_status(cid, timeout=90))["status"] == "completed"
            pid = provider_pid(state)
            asked = agent_loop_requests(fakes, agent)
            d = await kill_and_replace(d, cp, tmp_path, kept_payload(agent, tmp_path, cp, fakes), 0)
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-2", input={"text": "[[say:second]]"})
            assert (await cp.wait_for_command_status(cid, timeout=90))["status"] == "completed"
            assert provider_pid(state) == pid
            assert agent_loop_requests(fakes, agent) == asked + 1
            check_run(cp, "run-2", terminal="run.completed")
            turn = keeper_state.read_turn(state)
            assert turn is not None and turn.run_id == "run-2" and turn.extra["agent"]["protocolVersion"] == 1
        finally:
            d.close()
            kept.discard(state)


@pytest.mark.provider
async def test_an_acp_handover_mid_stream_loses_nothing(tmp_path: Path, fakes: Fakes) -> None:
    """`agent-driver run --handover` with an ACP agent: the old process exits 0, the run goes on under
    the new one, whole and once, with the same agent process and no second model request."""
    agent = "acp:codex-acp"
    state = tmp_path / "state"
    async with control_plane(tmp_path) as cp:
        d1 = Driver(tmp_path, kept_payload(agent, tmp_path, cp, fakes), env=FAST)
        d2: DriverProcess | None = None
        try:
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=90)
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": LONG})
            await wait_word(cp, "run-1", 40, timeout=90)
            pid = provider_pid(state)
            asked = agent_loop_requests(fakes, agent)
            payload = kept_payload(agent, tmp_path, cp, fakes)
            d2 = DriverProcess(tmp_path, payload, "driver2", FAST, ("--handover",))
            assert await d1.wait(timeout=30) == 0
            status = await cp.wait_for_command_status(cid, timeout=120)
            assert status["status"] == "completed", status
            assert assert_whole_run(cp, "run-1")["epoch"] == 2
            assert_once(cp, "run-1")
            assert provider_pid(state) == pid
            assert agent_loop_requests(fakes, agent) == asked
        finally:
            d1.close()
            if d2 is not None:
                d2.close()
            kept.discard(state)


@pytest.mark.provider
async def test_a_continued_acp_run_can_be_cancelled(tmp_path: Path, fakes: Fakes) -> None:
    """The continued turn is cancelled natively (session/cancel to the same agent), not by a kill."""
    agent = "acp:codex-acp"
    state = tmp_path / "state"
    async with control_plane(tmp_path) as cp:
        d = Driver(tmp_path, kept_payload(agent, tmp_path, cp, fakes), env=FAST)
        try:
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=90)
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": runtimes.SLOW})
            await wait_word(cp, "run-1", 20, timeout=90)
            pid = provider_pid(state)
            d = await kill_and_replace(d, cp, tmp_path, kept_payload(agent, tmp_path, cp, fakes), 0)
            await cp.wait_for_event(INSTANCE, lambda e: e["run_id"] == "run-1" and e["epoch"] == 2, timeout=60)
            await cp.send_command(INSTANCE, "turn.cancel", run_id="run-1", reason="test")
            status = await cp.wait_for_command_status(cid, timeout=60)
            assert status["status"] == "cancelled", status
            term = check_run(cp, "run-1", terminal="run.cancelled")
            assert term["payload"]["details"]["phase"] == "interrupt", term["payload"]["details"]
            assert provider_pid(state) == pid
            cid2, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-2", input={"text": "[[say:ok]]"})
            assert (await cp.wait_for_command_status(cid2, timeout=90))["status"] == "completed"
        finally:
            d.close()
            kept.discard(state)


@pytest.mark.provider
async def test_without_a_grace_an_acp_run_ends_driver_restarted(tmp_path: Path, fakes: Fakes) -> None:
    agent = "acp:codex-acp"
    state = tmp_path / "state"
    async with control_plane(tmp_path) as cp:
        d = Driver(tmp_path, kept_payload(agent, tmp_path, cp, fakes, grace_ms=0), env=FAST)
        try:
            started = await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=90)
            assert {c["id"]: c["supported"] for c in started["payload"]["capabilities"]}["reattach"] is False
            await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": runtimes.SLOW})
            await wait_word(cp, "run-1", 5, timeout=90)
            assert kept.read_record(state) is None  # no keeper: the agent dies with its driver
            d = await kill_and_replace(d, cp, tmp_path, kept_payload(agent, tmp_path, cp, fakes, grace_ms=0), 0)
            term = await cp.wait_for_event(
                INSTANCE, lambda e: e["kind"] == "run.failed" and e["run_id"] == "run-1", timeout=60
            )
            assert term["payload"]["error"]["code"] == "driver.restarted"
        finally:
            d.close()


@pytest.mark.provider
async def test_a_successor_with_another_agent_command_does_not_attach(tmp_path: Path, fakes: Fakes) -> None:
    """The boot payload's agent command changed between the two processes: the kept agent is not this
    configuration's, so it is ended, a new one started, and the run in flight ends driver.restarted."""
    state = tmp_path / "state"
    async with control_plane(tmp_path) as cp:
        first = stubborn_payload(tmp_path, cp, fakes)
        d = Driver(tmp_path, first, env=FAST)
        try:
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=60)
            await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": "[[slow]]"})
            await wait_word(cp, "run-1", 10)
            pid = provider_pid(state)
            second = stubborn_payload(tmp_path, cp, fakes)
            command = second["execution"]["acp"]["command"]
            second["execution"]["acp"]["command"] = [command[0], "-X", "utf8", *command[1:]]
            d = await kill_and_replace(d, cp, tmp_path, second, 0)
            term = await cp.wait_for_event(
                INSTANCE, lambda e: e["kind"] == "run.failed" and e["run_id"] == "run-1", timeout=60
            )
            assert term["payload"]["error"]["code"] == "driver.restarted"
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-2", input={"text": "[[say:ok]]"})
            assert (await cp.wait_for_command_status(cid, timeout=60))["status"] == "completed"
            assert not alive(pid), "the other configuration's agent was left running"
            assert provider_pid(state) != pid
        finally:
            d.close()
            kept.discard(state)


@pytest.mark.provider
@pytest.mark.parametrize("kills", [1, 2])
async def test_session_state_reported_before_the_kill_is_not_reported_again(
    kills: int, tmp_path: Path, fakes: Fakes
) -> None:
    """A session state snapshot (not a run event: the kernel's gate does not see it) derived from the
    turn's output before the kill is stored once, however many drivers re-read that output."""
    state = tmp_path / "state"
    async with control_plane(tmp_path) as cp:
        d = Driver(tmp_path, stubborn_payload(tmp_path, cp, fakes), env=FAST)
        try:
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=60)
            cid, _ = await cp.send_command(
                INSTANCE, "input.start", run_id="run-1", input={"text": f"[[mode:plan-x]] {LONG}"}
            )
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "session.mode.updated", timeout=60)
            for n in range(kills):
                await wait_word(cp, "run-1", 40 * (n + 1))
                d = await kill_and_replace(d, cp, tmp_path, stubborn_payload(tmp_path, cp, fakes), n)
            status = await cp.wait_for_command_status(cid, timeout=90)
            assert status["status"] == "completed", status
            modes = [e for e in cp.events(INSTANCE) if e["kind"] == "session.mode.updated"]
            assert [(e["payload"]["current_mode_id"], e["epoch"]) for e in modes] == [("plan-x", 1)], modes
            assert_whole_run(cp, "run-1")
            assert_once(cp, "run-1")
        finally:
            d.close()
            kept.discard(state)


@pytest.mark.provider
async def test_no_driver_within_the_grace_leaves_no_acp_agent(tmp_path: Path, fakes: Fakes) -> None:
    agent = "acp:codex-acp"
    state = tmp_path / "state"
    async with control_plane(tmp_path) as cp:
        d = Driver(tmp_path, kept_payload(agent, tmp_path, cp, fakes, grace_ms=1500), env=FAST)
        try:
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=90)
            await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": runtimes.SLOW})
            await wait_word(cp, "run-1", 5, timeout=90)
            record = kept.read_record(state)
            assert record is not None
            pid = provider_pid(state)
            d.kill()
            t0 = time.monotonic()
            with anyio.fail_after(15):
                while alive(record.keeper_pid) or alive(pid):  # noqa: ASYNC110 (no event for another's exit)
                    await anyio.sleep(0.05)
            assert 1.0 < time.monotonic() - t0 < 10.0
            d = Driver(tmp_path, kept_payload(agent, tmp_path, cp, fakes, grace_ms=1500), name="driver2", env=FAST)
            term = await cp.wait_for_event(
                INSTANCE, lambda e: e["kind"] == "run.failed" and e["run_id"] == "run-1", timeout=60
            )
            assert term["payload"]["error"]["code"] == "driver.restarted"
        finally:
            d.close()
            kept.discard(state)


@pytest.mark.provider
async def test_a_steer_to_the_continued_acp_run_is_its_follow_up(tmp_path: Path, fakes: Fakes) -> None:
    """PROTOCOL §3.1 `follow_up` after a reattach: a steer the new driver takes while it continues the
    run is held until the predecessor's prompt ends, then sent as one more prompt of the same run."""
    agent = "acp:codex-acp"
    state = tmp_path / "state"
    async with control_plane(tmp_path) as cp:
        d = Driver(tmp_path, kept_payload(agent, tmp_path, cp, fakes), env=FAST)
        try:
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=90)
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": runtimes.SLOW})
            await wait_word(cp, "run-1", 20, timeout=90)
            pid = provider_pid(state)
            d = await kill_and_replace(d, cp, tmp_path, kept_payload(agent, tmp_path, cp, fakes), 0)
            await cp.wait_for_event(INSTANCE, lambda e: e["run_id"] == "run-1" and e["epoch"] == 2, timeout=60)
            steer, _ = await cp.send_command(
                INSTANCE, "input.steer", run_id="run-1", input={"text": "[[say:steered after the reattach]]"}
            )
            assert (await cp.wait_for_command_status(steer, timeout=90))["status"] == "completed"
            status = await cp.wait_for_command_status(cid, timeout=120)
            assert status["status"] == "completed", status
            term = check_run(cp, "run-1", terminal="run.completed")
            assert term["payload"]["final_message_text"] == "steered after the reattach"
            completed = [e for e in cp.events(INSTANCE, run_id="run-1") if e["kind"] == "message.completed"]
            # The whole 20 s `[[slow]]`: the steer must reach the new driver while the first prompt runs.
            assert [e["payload"]["text"].strip() for e in completed] == [SLOW_TEXT, "steered after the reattach"]
            assert_once(cp, "run-1")
            assert provider_pid(state) == pid
        finally:
            d.close()
            kept.discard(state)


@pytest.mark.provider
async def test_a_run_of_two_prompts_continues_from_its_first(tmp_path: Path, fakes: Fakes) -> None:
    """Killed during a follow-up prompt the dead driver sent (a steer): the new driver adopts both
    `session/prompt` ids from the input log, re-derives both turns, and ends the run at the second's
    answer, each message stored once."""
    agent = "acp:codex-acp"
    state = tmp_path / "state"
    async with control_plane(tmp_path) as cp:
        d = Driver(tmp_path, kept_payload(agent, tmp_path, cp, fakes), env=FAST)
        try:
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=90)
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": "[[slow:60]]"})
            await wait_word(cp, "run-1", 5, timeout=90)
            steer, _ = await cp.send_command(INSTANCE, "input.steer", run_id="run-1", input={"text": LONG})
            assert (await cp.wait_for_command_status(steer, timeout=90))["status"] == "completed"
            await wait_word(cp, "run-1", 100, timeout=90)  # the first prompt's reply ends at word59
            pid = provider_pid(state)
            asked = agent_loop_requests(fakes, agent)
            d = await kill_and_replace(d, cp, tmp_path, kept_payload(agent, tmp_path, cp, fakes), 0)
            status = await cp.wait_for_command_status(cid, timeout=120)
            assert status["status"] == "completed", status
            term = check_run(cp, "run-1", terminal="run.completed")
            assert term["epoch"] == 2
            assert term["payload"]["final_message_text"].strip() == runtimes_slow_text()
            completed = [e for e in cp.events(INSTANCE, run_id="run-1") if e["kind"] == "message.completed"]
            first = " ".join(f"word{i}" for i in range(60))
            assert [e["payload"]["text"].strip() for e in completed] == [first, runtimes_slow_text()]
            assert [e["epoch"] for e in completed] == [1, 2]
            assert_once(cp, "run-1")
            assert agent_loop_requests(fakes, agent) == asked
            assert provider_pid(state) == pid
        finally:
            d.close()
            kept.discard(state)


@pytest.mark.provider
async def test_a_kept_agent_killed_while_a_stray_holds_its_stdio_ends_its_run_crashed(
    tmp_path: Path, fakes: Fakes
) -> None:
    """The agent's own shell starts a process that leaves its group (setsid) holding the agent's stdout
    and stderr (through /proc), then kills the agent. Without a keeper the driver sees the exit and the
    run ends `provider.crashed` at once; the keeper waited for the end of both streams before it said
    the provider exited, so the run hung until the silence rule (and an idle provider's death was never
    seen). The run ends `provider.crashed`, and the next run gets a fresh agent."""
    state = tmp_path / "state"
    async with control_plane(tmp_path) as cp:
        payload = runtimes.payload("acp:stubborn", tmp_path, cp.url, fakes)
        payload["execution"] |= {"reattach_grace_ms": 30_000, "permission_policy": "full_access"}
        d = Driver(tmp_path, payload, env=FAST)
        try:
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=90)
            assert kept.read_record(state) is not None  # the agent is kept
            pid = provider_pid(state)
            stray = "setsid sleep 300 >/proc/$PPID/fd/1 2>/proc/$PPID/fd/2 </dev/null & sleep 0.2; kill -9 $PPID"
            await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": f"[[own-shell:{stray}]]"})
            term = await cp.wait_for_event(
                INSTANCE,
                lambda e: (
                    e["kind"].startswith("run.")
                    and e["run_id"] == "run-1"
                    and e["kind"] in ("run.completed", "run.failed", "run.cancelled")
                ),
                timeout=20,
            )
            assert term["kind"] == "run.failed" and term["payload"]["error"]["code"] == "provider.crashed", term
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-2", input={"text": "hello"})
            assert (await cp.wait_for_command_status(cid, timeout=60))["status"] == "completed"
            assert provider_pid(state) != pid
        finally:
            d.close()
            kept.discard(state)
