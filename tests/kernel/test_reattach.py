"""PROTOCOL §8.2 through real driver processes, the REAL Codex app-server and the reference control
plane: with `execution.reattach_grace_ms`, a driver SIGKILLed mid-stream is replaced by a new process on
the same `state_dir`, and the run in flight ends with its own terminal, its text whole, its lossless
events stored once, the same provider process, and no second request to the model.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from driver.keeper import kept
from driver.keeper import state as keeper_state
from driver.queue.rowmac import UNKEYED, RowMac, derive_key
from tests.faults.history import check_instance, check_run
from tests.integration.harness import INSTANCE, TOKEN, DriverProcess, control_plane
from tests.kernel import runtimes
from tests.kernel.runtimes import Fakes
from tests.kernel.support import Driver

FAST = {"AGENT_DRIVER_RESTART_BACKOFF_MS": "20", "AGENT_DRIVER_RESTART_BACKOFF_CAP_MS": "100"}
# The reply a run that must end whole streams: 160 chunks x 50 ms = 8 s, killed in at word40 and word80
# with seconds to spare, without waiting out the 20 s `[[slow]]` in every test.
REPLY_CHUNKS = 160
LONG = f"[[slow:{REPLY_CHUNKS}]]"
RUNTIME = "openai-app-server"


@pytest.fixture(autouse=True)
def driver_key() -> Any:
    """The keeper's files are authenticated under the journal's key: this test reads them like the driver."""
    keeper_state.use_mac(RowMac(derive_key(TOKEN, INSTANCE)))
    yield
    keeper_state.use_mac(UNKEYED)


def kept_payload(tmp: Path, cp: Any, fakes: Fakes, grace_ms: int = 30_000) -> dict[str, Any]:
    payload = runtimes.payload(RUNTIME, tmp, cp.url, fakes)
    payload["execution"]["reattach_grace_ms"] = grace_ms
    return payload


def provider_pid(state: Path) -> int:
    record = kept.read_record(state)
    assert record is not None and record.alive(), "no live keeper recorded"
    kids = keeper_state.children(record.keeper_pid)
    assert kids, "the keeper holds no provider"
    return kids[0]


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def wait_word(cp: Any, run_id: str, word: int, timeout: float = 60) -> None:
    """Until the streamed reply has reached `wordN` (deltas are best-effort: a later one will do)."""

    def reached(e: dict[str, Any]) -> bool:
        if e["kind"] != "message.delta" or e["run_id"] != run_id:
            return False
        words = e["payload"]["text"].split()
        return any(w.startswith("word") and w[4:].isdigit() and int(w[4:]) >= word for w in words)

    await cp.wait_for_event(INSTANCE, reached, timeout=timeout, kinds="message.delta")


def model_requests(fakes: Fakes) -> int:
    return len(fakes.responses.requests)


def assert_whole_run(cp: Any, run_id: str) -> dict[str, Any]:
    term = check_run(cp, run_id, terminal="run.completed")
    assert term["payload"]["final_message_text"].strip() == runtimes_slow_text()
    completed = [e for e in cp.events(INSTANCE, run_id=run_id) if e["kind"] == "message.completed"]
    assert len(completed) == 1, [e["payload"]["message_id"] for e in completed]
    assert completed[0]["payload"]["text"].strip() == runtimes_slow_text()
    return term


def runtimes_slow_text() -> str:
    """The text of the `LONG` reply."""
    from agent_lab.testing.script import slow_text

    return slow_text(REPLY_CHUNKS)


@pytest.mark.provider
async def test_driver_killed_mid_stream_the_run_continues(tmp_path: Path, fakes: Fakes) -> None:
    """Two kills in one run: the first is the one-kill case (each step checked in the loop; a run
    ending after one reattach is the other reattach tests' case), the second a successor's successor."""
    kills = 2
    state = tmp_path / "state"
    async with control_plane(tmp_path) as cp:
        d = Driver(tmp_path, kept_payload(tmp_path, cp, fakes), env=FAST)
        try:
            started = await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=60)
            assert {c["id"]: c["supported"] for c in started["payload"]["capabilities"]}["reattach"] is True
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": LONG})
            pid = None
            for n in range(kills):
                await wait_word(cp, "run-1", 40 * (n + 1))
                pid = provider_pid(state) if pid is None else pid
                asked = model_requests(fakes)
                d.kill()
                await cp.wait_disconnected(INSTANCE, timeout=10)
                assert alive(pid), "the provider died with its driver"
                t0 = time.monotonic()
                d = Driver(tmp_path, kept_payload(tmp_path, cp, fakes), name=f"driver{n + 2}", env=FAST)
                after = max(e["seq"] for e in cp.events(INSTANCE) if e["epoch"] == n + 1)
                epoch = n + 2
                await cp.wait_for_event(
                    INSTANCE, lambda e, epoch=epoch: e["run_id"] == "run-1" and e["epoch"] == epoch, timeout=30
                )
                print(f"reattach: first event of the continued run {1000 * (time.monotonic() - t0):.0f} ms")
                assert after > 0
                assert provider_pid(state) == pid, "not the same provider process"
            status = await cp.wait_for_command_status(cid, timeout=90)
            assert status["status"] == "completed", status
            term = assert_whole_run(cp, "run-1")
            assert term["epoch"] == kills + 1
            assert model_requests(fakes) == asked, "the model was asked again"
            assert not [e for e in cp.events(INSTANCE) if e["kind"] == "run.failed"]
            check_instance(cp)
            # The provider goes on serving runs after the reattach.
            cid2, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-2", input={"text": "[[say:ok]]"})
            assert (await cp.wait_for_command_status(cid2, timeout=60))["status"] == "completed"
            assert provider_pid(state) == pid
        finally:
            d.close()
            kept.discard(state)


@pytest.mark.provider
async def test_a_driver_killed_while_it_reattaches_is_reattached_by_the_next(tmp_path: Path, fakes: Fakes) -> None:
    """The second process dies as soon as it has connected, in the middle of its own reattach: the
    third finds the same keeper and what the second journaled, and the run still ends whole, once."""
    state = tmp_path / "state"
    async with control_plane(tmp_path) as cp:
        d = Driver(tmp_path, kept_payload(tmp_path, cp, fakes), env=FAST)
        try:
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=60)
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": LONG})
            await wait_word(cp, "run-1", 40)
            pid = provider_pid(state)
            asked = model_requests(fakes)
            d.kill()
            await cp.wait_disconnected(INSTANCE, timeout=10)
            d = Driver(tmp_path, kept_payload(tmp_path, cp, fakes), name="driver2", env=FAST)
            await cp.wait_connected(INSTANCE, timeout=30)
            d.kill()
            await cp.wait_disconnected(INSTANCE, timeout=10)
            assert alive(pid), "the provider died with the second driver"
            d = Driver(tmp_path, kept_payload(tmp_path, cp, fakes), name="driver3", env=FAST)
            status = await cp.wait_for_command_status(cid, timeout=90)
            assert status["status"] == "completed", status
            assert assert_whole_run(cp, "run-1")["epoch"] == 3
            assert provider_pid(state) == pid
            assert model_requests(fakes) == asked, "the model was asked again"
            check_instance(cp)
        finally:
            d.close()
            kept.discard(state)


@pytest.mark.provider
async def test_a_permission_pending_across_the_kill_is_answered(tmp_path: Path, fakes: Fakes) -> None:
    """The request the dead driver announced keeps its request_id: the CP answers the request it saw,
    the new process announces nothing twice, and the approved command runs in the same provider."""
    state = tmp_path / "state"
    async with control_plane(tmp_path) as cp:
        d = Driver(tmp_path, kept_payload(tmp_path, cp, fakes), env=FAST)
        try:
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=60)
            text = runtimes.PERMISSION[RUNTIME]
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": text})
            asked = await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "permission.requested", timeout=60)
            pid = provider_pid(state)
            d.kill()
            await cp.wait_disconnected(INSTANCE, timeout=10)
            d = Driver(tmp_path, kept_payload(tmp_path, cp, fakes), name="driver2", env=FAST)
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started" and e["epoch"] == 2, timeout=60)
            allow = next(o["option_id"] for o in asked["payload"]["options"] if o["kind"] == "allow_once")
            resolve, _ = await cp.send_command(
                INSTANCE, "permission.resolve", request_id=asked["payload"]["request_id"], option_id=allow
            )
            assert (await cp.wait_for_command_status(resolve, timeout=30))["status"] == "completed"
            status = await cp.wait_for_command_status(cid, timeout=90)
            assert status["status"] == "completed", status
            assert (tmp_path / "cwd" / "notes.txt").exists(), "the approved command did not run"
            check_run(cp, "run-1", terminal="run.completed")
            assert provider_pid(state) == pid
            requested = [e["payload"]["request_id"] for e in cp.events(INSTANCE, "permission.requested")]
            assert requested == [asked["payload"]["request_id"]], "a request was announced twice"
            decided = [e["payload"] for e in cp.events(INSTANCE, "permission.resolved")]
            assert [(p["request_id"], p["outcome"]) for p in decided] == [(requested[0], "allowed")]
        finally:
            d.close()
            kept.discard(state)


@pytest.mark.provider
async def test_the_continued_codex_calls_host_tools_at_the_address_it_was_given(tmp_path: Path, fakes: Fakes) -> None:
    """Codex keeps the host MCP server's URL and token it was started with: the new driver serves them
    (driver/adapters/common/host_server.py), so a host tool called after the reattach reaches the CP."""
    state = tmp_path / "state"
    schema = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}

    def payload() -> dict[str, Any]:
        p = kept_payload(tmp_path, cp, fakes)
        p["execution"]["host_tools"] = [{"name": "lookup", "description": "Look a thing up", "input_schema": schema}]
        p["execution"]["permission_policy"] = "full_access"
        return p

    async with control_plane(tmp_path) as cp:
        d = Driver(tmp_path, payload(), env=FAST)
        try:
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=60)
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": LONG})
            await wait_word(cp, "run-1", 40)
            pid = provider_pid(state)
            d.kill()
            await cp.wait_disconnected(INSTANCE, timeout=10)
            d = Driver(tmp_path, payload(), name="driver2", env=FAST)
            assert (await cp.wait_for_command_status(cid, timeout=90))["status"] == "completed"
            text = '[[mcp:host:lookup:{"q": "teal"}]]'
            cid2, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-2", input={"text": text})
            called = await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "host_tool.called", timeout=90)
            assert called["epoch"] == 2 and called["payload"]["name"] == "lookup"
            await cp.send_command(
                INSTANCE,
                "host_tool.result",
                call_id=called["payload"]["call_id"],
                content=[{"type": "text", "text": "teal is a colour"}],
                is_error=False,
            )
            assert (await cp.wait_for_command_status(cid2, timeout=90))["status"] == "completed"
            resolved = [e["payload"] for e in cp.events(INSTANCE, "host_tool.resolved")]
            assert resolved == [{"call_id": called["payload"]["call_id"], "outcome": "completed"}]
            assert "teal is a colour" in str(fakes.responses.requests[-1])
            assert provider_pid(state) == pid
        finally:
            d.close()
            kept.discard(state)


@pytest.mark.provider
async def test_no_driver_within_the_grace_leaves_nothing(tmp_path: Path, fakes: Fakes) -> None:
    state = tmp_path / "state"
    async with control_plane(tmp_path) as cp:
        d = Driver(tmp_path, kept_payload(tmp_path, cp, fakes, grace_ms=1500), env=FAST)
        try:
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=60)
            await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": runtimes.SLOW})
            await wait_word(cp, "run-1", 5)
            record = kept.read_record(state)
            assert record is not None
            pid = provider_pid(state)
            d.kill()
            t0 = time.monotonic()
            with anyio.fail_after(15):
                while alive(record.keeper_pid) or alive(pid):  # noqa: ASYNC110 (no event for another's exit)
                    await anyio.sleep(0.05)
            gone = time.monotonic() - t0
            assert 1.0 < gone < 10.0, gone
            # A new driver then ends the run driver.restarted, as without a keeper.
            d = Driver(tmp_path, kept_payload(tmp_path, cp, fakes, grace_ms=1500), name="driver2", env=FAST)
            term = await cp.wait_for_event(
                INSTANCE, lambda e: e["kind"] == "run.failed" and e["run_id"] == "run-1", timeout=30
            )
            assert term["payload"]["error"]["code"] == "driver.restarted"
        finally:
            d.close()
            kept.discard(state)


@pytest.mark.provider
async def test_without_a_grace_the_run_ends_driver_restarted(tmp_path: Path, fakes: Fakes) -> None:
    state = tmp_path / "state"
    async with control_plane(tmp_path) as cp:
        d = Driver(tmp_path, kept_payload(tmp_path, cp, fakes, grace_ms=0), env=FAST)
        try:
            started = await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=60)
            caps = {c["id"]: c["supported"] for c in started["payload"]["capabilities"]}
            assert caps["reattach"] is False
            await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": runtimes.SLOW})
            await wait_word(cp, "run-1", 5)
            assert kept.read_record(state) is None
            d.kill()
            d = Driver(tmp_path, kept_payload(tmp_path, cp, fakes, grace_ms=0), name="driver2", env=FAST)
            term = await cp.wait_for_event(
                INSTANCE, lambda e: e["kind"] == "run.failed" and e["run_id"] == "run-1", timeout=30
            )
            assert term["payload"]["error"]["code"] == "driver.restarted"
        finally:
            d.close()
            kept.discard(state)


@pytest.mark.provider
async def test_without_a_grace_a_pending_permission_is_resolved_before_driver_restarted(
    tmp_path: Path, fakes: Fakes
) -> None:
    """The run dies with its driver, and so does the request it had open: the next process resolves it
    `cancelled` before the run's driver.restarted, so the CP is never left holding it."""
    async with control_plane(tmp_path) as cp:
        d = Driver(tmp_path, kept_payload(tmp_path, cp, fakes, grace_ms=0), env=FAST)
        try:
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=60)
            text = runtimes.PERMISSION[RUNTIME]
            await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": text})
            asked = await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "permission.requested", timeout=60)
            d.kill()
            d = Driver(tmp_path, kept_payload(tmp_path, cp, fakes, grace_ms=0), name="driver2", env=FAST)
            term = await cp.wait_for_event(
                INSTANCE, lambda e: e["kind"] == "run.failed" and e["run_id"] == "run-1", timeout=30
            )
            assert term["payload"]["error"]["code"] == "driver.restarted"
            ends = [(e["payload"], e["seq"]) for e in cp.events(INSTANCE, "permission.resolved")]
            assert [p for p, _ in ends] == [
                {
                    "request_id": asked["payload"]["request_id"],
                    "outcome": "cancelled",
                    "option_id": None,
                    "decided_by": "cancel",
                }
            ]
            assert (
                ends[0][1] < term["seq"]
                and ends[0][0]
                and cp.events(INSTANCE, "permission.resolved")[0]["run_id"] == "run-1"
            )
        finally:
            d.close()


def test_keeper_is_stdlib_only() -> None:
    """`python -I keeper.py` imports nothing of the driver's or a third party's."""
    source = Path(kept.KEEPER_PY).read_text()
    imports = {line.split()[1].split(".")[0] for line in source.splitlines() if line.startswith(("import ", "from "))}
    import sys

    assert imports <= set(sys.stdlib_module_names) | {"__future__"}, imports
    assert os.path.getsize(kept.KEEPER_PY) < 20_000


@pytest.mark.provider
async def test_handover_mid_stream_loses_nothing(tmp_path: Path, fakes: Fakes) -> None:
    """`agent-driver run --handover`: the new process asks the running one to hand over, which exits 0;
    the run goes on under the new process, whole, once, with the same provider."""
    state = tmp_path / "state"
    async with control_plane(tmp_path) as cp:
        d1 = Driver(tmp_path, kept_payload(tmp_path, cp, fakes), env=FAST)
        d2: Driver | None = None
        try:
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=60)
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": LONG})
            await wait_word(cp, "run-1", 40)
            pid = provider_pid(state)
            asked = model_requests(fakes)
            d2 = DriverProcess(tmp_path, kept_payload(tmp_path, cp, fakes), "driver2", FAST, ("--handover",))
            assert await d1.wait(timeout=30) == 0
            status = await cp.wait_for_command_status(cid, timeout=90)
            assert status["status"] == "completed", status
            term = assert_whole_run(cp, "run-1")
            assert term["epoch"] == 2
            assert provider_pid(state) == pid
            assert model_requests(fakes) == asked
        finally:
            d1.close()
            if d2 is not None:
                d2.close()
            kept.discard(state)


@pytest.mark.provider
async def test_a_continued_run_can_be_cancelled(tmp_path: Path, fakes: Fakes) -> None:
    state = tmp_path / "state"
    async with control_plane(tmp_path) as cp:
        d = Driver(tmp_path, kept_payload(tmp_path, cp, fakes), env=FAST)
        try:
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=60)
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": runtimes.SLOW})
            await wait_word(cp, "run-1", 20)
            pid = provider_pid(state)
            d.kill()
            await cp.wait_disconnected(INSTANCE, timeout=10)
            d = Driver(tmp_path, kept_payload(tmp_path, cp, fakes), name="driver2", env=FAST)
            await cp.wait_for_event(INSTANCE, lambda e: e["run_id"] == "run-1" and e["epoch"] == 2, timeout=30)
            # The continued turn is interrupted natively (turn/interrupt), not by killing the provider.
            await cp.send_command(INSTANCE, "turn.cancel", run_id="run-1", reason="test")
            status = await cp.wait_for_command_status(cid, timeout=60)
            assert status["status"] == "cancelled", status
            term = check_run(cp, "run-1", terminal="run.cancelled")
            assert term["payload"]["details"]["phase"] == "interrupt", term["payload"]["details"]
            assert provider_pid(state) == pid
            cid2, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-2", input={"text": "[[say:ok]]"})
            assert (await cp.wait_for_command_status(cid2, timeout=60))["status"] == "completed"
        finally:
            d.close()
            kept.discard(state)


@pytest.mark.provider
async def test_claude_says_reattach_is_unsupported_and_its_run_ends_driver_restarted(
    tmp_path: Path, fakes: Fakes
) -> None:
    state = tmp_path / "state"
    async with control_plane(tmp_path) as cp:
        payload = runtimes.payload("claude-agent-sdk", tmp_path, cp.url, fakes)
        payload["execution"]["reattach_grace_ms"] = 30_000
        d = Driver(tmp_path, payload, env=FAST)
        try:
            started = await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=60)
            assert {c["id"]: c["supported"] for c in started["payload"]["capabilities"]}["reattach"] is False
            await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": runtimes.SLOW})
            await wait_word(cp, "run-1", 5)
            assert kept.read_record(state) is None  # no keeper: the provider dies with its driver
            d.kill()
            d = Driver(tmp_path, payload, name="driver2", env=FAST)
            term = await cp.wait_for_event(
                INSTANCE, lambda e: e["kind"] == "run.failed" and e["run_id"] == "run-1", timeout=60
            )
            assert term["payload"]["error"]["code"] == "driver.restarted"
        finally:
            d.close()


@pytest.mark.provider
async def test_idle_provider_is_reattached_and_a_stop_ends_the_keeper(tmp_path: Path, fakes: Fakes) -> None:
    state = tmp_path / "state"
    async with control_plane(tmp_path) as cp:
        d = Driver(tmp_path, kept_payload(tmp_path, cp, fakes), env=FAST)
        try:
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": "[[say:first]]"})
            assert (await cp.wait_for_command_status(cid, timeout=60))["status"] == "completed"
            pid = provider_pid(state)
            asked = model_requests(fakes)
            d.kill()
            await cp.wait_disconnected(INSTANCE, timeout=10)
            d = Driver(tmp_path, kept_payload(tmp_path, cp, fakes), name="driver2", env=FAST)
            # No run in flight: the idle provider is taken over as it is, its thread open.
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-2", input={"text": "[[say:second]]"})
            assert (await cp.wait_for_command_status(cid, timeout=60))["status"] == "completed"
            assert provider_pid(state) == pid
            assert model_requests(fakes) == asked + 1
            check_run(cp, "run-2", terminal="run.completed")
            record = kept.read_record(state)
            assert record is not None
            cid, _ = await cp.send_command(INSTANCE, "session.stop", reason="done")
            assert await d.wait(timeout=60) == 0
            assert not alive(pid) and not alive(record.keeper_pid), "a stop must end the kept tree"
            assert kept.read_record(state) is None
        finally:
            d.close()
            kept.discard(state)
