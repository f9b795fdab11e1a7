"""PROTOCOL §3 and §8 through the real driver process and the reference control plane: the current native
session survives a provider replacement (for every REAL runtime), `session.reset` is never undone by a
later replacement, command statuses are facts that agree with their run after any restart, and a status
produced while the control plane is down still reaches its store.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
from pathlib import Path
from typing import Any

import anyio
import pytest
from agent_lab.controlplane.server import ControlPlane

from tests.integration.harness import INSTANCE, TOKEN, boot_payload, control_plane
from tests.kernel import runtimes
from tests.kernel.runtimes import RUNTIMES, Fakes
from tests.kernel.support import Driver, terminals, wait_diagnostic, wait_provider, wait_terminal

FAST = {"AGENT_DRIVER_RESTART_BACKOFF_MS": "20", "AGENT_DRIVER_RESTART_BACKOFF_CAP_MS": "100"}


async def turn(cp: Any, run_id: str, text: str, timeout: float = 60) -> dict[str, Any]:
    cid, _ = await cp.send_command(INSTANCE, "input.start", run_id=run_id, input={"text": text})
    status: dict[str, Any] = await cp.wait_for_command_status(cid, timeout=timeout)
    return status


def last_model_request(fakes: Fakes, runtime: str) -> str:
    """The newest request the fake model endpoint received, as text."""
    fake = fakes.anthropic if runtime == "claude-agent-sdk" else fakes.responses
    assert fake.requests, "the fake model was never asked"
    return json.dumps(fake.requests[-1])


def resume_refs(cp: Any) -> list[str]:
    return [e["payload"]["value"] for e in cp.events(INSTANCE) if e["kind"] == "runtime.resume.updated"]


async def kill_provider_while_idle(cp: Any, driver: Driver) -> None:
    """SIGKILL the provider's process group and wait until the driver has a new one running."""
    pid = await wait_provider(driver, timeout=30)
    after = max((e["seq"] for e in cp.events(INSTANCE)), default=0)
    os.killpg(pid, signal.SIGKILL)
    await wait_diagnostic(cp, "provider.restarted", timeout=60, after_seq=after)


@pytest.mark.provider
@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_provider_killed_next_run_sees_the_conversation(runtime: str, tmp_path: Path, fakes: Fakes) -> None:
    async with control_plane(tmp_path) as cp:
        d = Driver(tmp_path, runtimes.payload(runtime, tmp_path, cp.url, fakes), env=FAST)
        try:
            first = await turn(cp, "run-1", "Please remember the word PELICAN-7341.")
            assert first["status"] == "completed", first
            refs_before = resume_refs(cp)
            assert refs_before, "no runtime.resume.updated before the crash"

            await kill_provider_while_idle(cp, d)
            second = await turn(cp, "run-2", "Which word did I ask you to remember?")
            assert second["status"] == "completed", second
            # The new provider was given the earlier conversation: resumed natively, or replayed.
            assert "PELICAN-7341" in last_model_request(fakes, runtime)
            reset = [e for e in cp.events(INSTANCE) if e["kind"] == "runtime.session.reset"]
            if reset:
                # A provider that could not resume said so, and named the session it replaced.
                assert reset[-1]["payload"]["previous"] == refs_before[-1]
            else:
                assert resume_refs(cp)[-1] == refs_before[-1], "resumed, but not the current session"
        finally:
            d.close()


@pytest.mark.provider
@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_reset_session_is_not_resumed_after_a_crash(runtime: str, tmp_path: Path, fakes: Fakes) -> None:
    async with control_plane(tmp_path) as cp:
        d = Driver(tmp_path, runtimes.payload(runtime, tmp_path, cp.url, fakes), env=FAST)
        try:
            assert (await turn(cp, "run-1", "Please remember the word OSPREY-5120."))["status"] == "completed"
            cid, _ = await cp.send_command(INSTANCE, "session.reset", reason="test")
            reset = await cp.wait_for_command_status(cid, timeout=60)
            assert reset["status"] == "completed", reset
            fresh = reset["result"]["current"]
            assert fresh and fresh != reset["result"]["previous"]

            await kill_provider_while_idle(cp, d)
            assert (await turn(cp, "run-2", "Which word did I ask you to remember?"))["status"] == "completed"
            # Nothing from before the reset reached the model: neither resumed nor replayed.
            assert "OSPREY-5120" not in last_model_request(fakes, runtime)
            finished = [e for e in cp.events(INSTANCE) if e["kind"] == "command.finished"]
            assert any(e["payload"]["command_id"] == cid for e in finished)
        finally:
            d.close()


async def test_stubborn_agent_replays_the_transcript_after_a_crash(tmp_path: Path) -> None:
    """An agent that cannot load the old session (our stubborn agent forgets its sessions when it dies):
    a fresh session, `runtime.session.reset{previous, current}`, and the transcript replayed."""
    async with control_plane(tmp_path) as cp:
        payload = boot_payload(tmp_path, cp.url)
        payload["execution"]["recovery_messages"] = [{"role": "user", "text": "boot-time history HERON"}]
        payload["execution"]["acp"]["env"] = {"STUBBORN_LOAD_SESSION": "0"}
        d = Driver(tmp_path, payload, env=FAST)
        try:
            first = await turn(cp, "run-1", "[[say:noted KESTREL]] remember KESTREL")
            assert first["status"] == "completed"
            first_prompt = await cp.wait_for_event(
                INSTANCE, lambda e: e["kind"] == "runtime.session.reset", timeout=10
            )
            # No native ref at boot but a history: fresh session, reset with previous = null.
            assert first_prompt["payload"]["previous"] is None
            current = first_prompt["payload"]["current"]

            await kill_provider_while_idle(cp, d)
            await turn(cp, "run-2", "[[echo]]")
            term = await wait_terminal(cp, "run-2")
            replayed = term["payload"]["final_message_text"]
            assert "HERON" in replayed and "remember KESTREL" in replayed and "noted KESTREL" in replayed
            resets = [e for e in cp.events(INSTANCE) if e["kind"] == "runtime.session.reset"]
            assert resets[-1]["payload"]["previous"] == current
            assert resets[-1]["payload"]["current"] != current
            assert resume_refs(cp)[-1] == resets[-1]["payload"]["current"]
        finally:
            d.close()


async def test_session_reset_empties_what_is_replayed(tmp_path: Path) -> None:
    async with control_plane(tmp_path) as cp:
        payload = boot_payload(tmp_path, cp.url)
        payload["execution"]["recovery_messages"] = [{"role": "assistant", "text": "boot-time history HERON"}]
        payload["execution"]["acp"]["env"] = {"STUBBORN_LOAD_SESSION": "0"}
        d = Driver(tmp_path, payload, env=FAST)
        try:
            assert (await turn(cp, "run-1", "remember KESTREL"))["status"] == "completed"
            cid, _ = await cp.send_command(INSTANCE, "session.reset", reason="test")
            assert (await cp.wait_for_command_status(cid, timeout=30))["status"] == "completed"
            await kill_provider_while_idle(cp, d)
            await turn(cp, "run-2", "[[echo]]")
            text = (await wait_terminal(cp, "run-2"))["payload"]["final_message_text"]
            # A new session's first prompt opens with the driver's instructions (the stub agent takes
            # no system prompt); nothing else may come before the prompt.
            text = re.sub(r"(?s)^<instructions>\n.*?\n</instructions>\n", "", text)
            assert text.strip() == "[[echo]]", text
        finally:
            d.close()


async def test_reset_is_a_state_input_during_it_is_busy(tmp_path: Path) -> None:
    async with control_plane(tmp_path) as cp:
        payload = boot_payload(tmp_path, cp.url)
        payload["execution"]["acp"]["env"] = {"STUBBORN_NEW_SESSION_DELAY_MS": "1500"}
        d = Driver(tmp_path, payload, env=FAST)
        try:
            assert (await turn(cp, "run-1", "hello"))["status"] == "completed"
            # An input during a reset fails driver.busy (retryable); the reset completes.
            reset, _ = await cp.send_command(INSTANCE, "session.reset", reason="test")
            busy = await turn(cp, "run-busy", "hello", timeout=10)
            assert busy["status"] == "failed" and busy["error"]["code"] == "driver.busy", busy
            assert busy["error"]["retryable"] is True
            assert (await cp.wait_for_command_status(reset, timeout=30))["status"] == "completed"
            # A reset during a run is refused.
            slow, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-2", input={"text": "[[slow]]"})
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "message.started" and e["run_id"] == "run-2")
            during, _ = await cp.send_command(INSTANCE, "session.reset", reason="test")
            refused = await cp.wait_for_command_status(during, timeout=10)
            assert refused["status"] == "failed" and refused["error"]["code"] == "driver.run_active"
            await cp.send_command(INSTANCE, "turn.cancel", run_id="run-2", reason="test")
            assert (await cp.wait_for_command_status(slow, timeout=30))["status"] == "cancelled"
        finally:
            d.close()


def journal_has(state_dir: Path, kind: str) -> bool:
    db = sqlite3.connect(f"file:{state_dir / 'driver' / 'journal.sqlite3'}?mode=ro", uri=True)
    try:
        return db.execute("SELECT 1 FROM outbox WHERE kind = ?", (kind,)).fetchone() is not None
    except sqlite3.OperationalError:
        return False
    finally:
        db.close()


async def test_status_produced_while_the_cp_is_down_reaches_the_store(tmp_path: Path) -> None:
    async with control_plane(tmp_path) as cp:
        payload = boot_payload(tmp_path, cp.url)
        payload["execution"]["acp"]["env"] = {"STUBBORN_NEW_SESSION_DELAY_MS": "1500"}
        d = Driver(tmp_path, payload, env=FAST)
        try:
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=30)
            cid, _ = await cp.send_command(INSTANCE, "session.reset", reason="test")
            await cp.wait_for(INSTANCE, lambda i: i["type"] == "command.update" and i["command_id"] == cid)
            await cp.stop(1012)
            # The reset completes while the CP is down: its status is journaled as a fact.
            with anyio.fail_after(30):
                while not journal_has(tmp_path / "state", "command.finished"):  # noqa: ASYNC110 (a file)
                    await anyio.sleep(0.05)
            await cp.start()
            st = await cp.wait_for_command_status(cid, timeout=30)
            assert st["status"] == "completed", st
            facts = [e for e in cp.events(INSTANCE) if e["kind"] == "command.finished"]
            assert [e["payload"]["status"] for e in facts if e["payload"]["command_id"] == cid] == ["completed"]
            # The CP learnt it from the event: the driver counted it as done in its next hello.
            hello = cp.hello(INSTANCE)
            assert hello is not None and hello["last_command_seq"] >= 1
        finally:
            d.close()


async def test_sigkill_after_a_journaled_terminal_run_and_command_agree(tmp_path: Path) -> None:
    async with control_plane(tmp_path) as cp:
        d1 = Driver(tmp_path, boot_payload(tmp_path, cp.url), env=FAST)
        try:
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=30)
            cp.faults.partial_receipt_events = 0  # nothing is stored: the terminal stays journaled
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": "[[say:done]]"})
            with anyio.fail_after(30):
                while not journal_has(tmp_path / "state", "run.completed"):  # noqa: ASYNC110 (a file)
                    await anyio.sleep(0.05)
            d1.kill()
            await cp.wait_disconnected(INSTANCE, timeout=10)
            cp.faults.reset()
            d2 = Driver(tmp_path, boot_payload(tmp_path, cp.url), name="driver2", env=FAST)
            try:
                st = await cp.wait_for_command_status(cid, timeout=30)
                assert st["status"] == "completed", st
                terms = terminals(cp, "run-1")
                assert [t["kind"] for t in terms] == ["run.completed"]
                assert terms[0]["epoch"] == 1  # the dead process's own terminal, resent
            finally:
                d2.close()
        finally:
            d1.close()


@pytest.mark.provider
@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_driver_killed_and_restarted_resumes_the_journal_ref(
    runtime: str, tmp_path: Path, fakes: Fakes
) -> None:
    async with control_plane(tmp_path) as cp:
        d1 = Driver(tmp_path, runtimes.payload(runtime, tmp_path, cp.url, fakes), env=FAST)
        try:
            assert (await turn(cp, "run-1", "Please remember the word GANNET-2291."))["status"] == "completed"
            ref = resume_refs(cp)[-1]
            d1.kill()
            await cp.wait_disconnected(INSTANCE, timeout=10)
            # A new process on the same state_dir, its boot payload naming no ref: the journal's is resumed.
            d2 = Driver(tmp_path, runtimes.payload(runtime, tmp_path, cp.url, fakes), name="driver2", env=FAST)
            try:
                assert (await turn(cp, "run-2", "Which word did I ask you to remember?"))["status"] == "completed"
                assert "GANNET-2291" in last_model_request(fakes, runtime)
                epoch2 = [e for e in cp.events(INSTANCE) if e["epoch"] == 2]
                resets = [e for e in epoch2 if e["kind"] == "runtime.session.reset"]
                if resets:
                    assert resets[0]["payload"]["previous"] == ref
                else:
                    assert next(e["payload"]["value"] for e in epoch2 if e["kind"] == "runtime.resume.updated") == ref
            finally:
                d2.close()
        finally:
            d1.close()


@pytest.mark.provider
@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_new_sandbox_with_the_cp_ref_resets_and_replays(runtime: str, tmp_path: Path, fakes: Fakes) -> None:
    """Sandbox lost (cattle): a new instance with a fresh cwd and state_dir, given the CP's last ref and
    its recovery messages. The provider cannot resume a session whose files were in the lost sandbox:
    reset, then replay."""
    old, new, second = tmp_path / "old", tmp_path / "new", "drv-it.2"
    old.mkdir()
    new.mkdir()
    async with ControlPlane(tmp_path / "cp.sqlite3", tokens={TOKEN: {INSTANCE, second}}) as cp:
        d1 = Driver(old, runtimes.payload(runtime, old, cp.url, fakes), env=FAST)
        try:
            assert (await turn(cp, "run-1", "Please remember the word SKUA-8802."))["status"] == "completed"
            ref = resume_refs(cp)[-1]
        finally:
            d1.close()
        payload = runtimes.payload(runtime, new, cp.url, fakes)
        payload["driver_instance_id"] = second
        payload["execution"]["native_resume"] = {"runtime": payload["execution"]["runtime"], "value": ref}
        payload["execution"]["recovery_messages"] = [
            {"role": "user", "text": "Please remember the word SKUA-8802."},
            {"role": "assistant", "text": "Noted."},
        ]
        d2 = Driver(new, payload, name="driver2", env=FAST)
        try:
            cid, _ = await cp.send_command(second, "input.start", run_id="run-2", input={"text": "Which word?"})
            assert (await cp.wait_for_command_status(cid, timeout=60))["status"] == "completed"
            assert "SKUA-8802" in last_model_request(fakes, runtime)
            resets = [e for e in cp.events(second) if e["kind"] == "runtime.session.reset"]
            assert resets and resets[-1]["payload"]["previous"] == ref, resets
            assert resets[-1]["payload"]["current"] != ref
        finally:
            d2.close()


@pytest.mark.provider
@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_link_lost_mid_run_the_run_continues_and_nothing_is_lost(
    runtime: str, tmp_path: Path, fakes: Fakes
) -> None:
    from tests.faults.history import check_instance, check_run

    async with control_plane(tmp_path) as cp:
        d = Driver(tmp_path, runtimes.payload(runtime, tmp_path, cp.url, fakes), env=FAST)
        try:
            assert (await turn(cp, "run-1", "Please remember the word TERN-4410."))["status"] == "completed"
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-2", input={"text": "[[slow]]"})
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "message.started" and e["run_id"] == "run-2")
            assert await cp.close_link(INSTANCE, 1006)  # the TCP connection drops, no close frame
            await cp.wait_disconnected(INSTANCE, timeout=10)
            # The run goes on while the link is down; after the reconnect everything lossless arrives.
            await cp.wait_connected(INSTANCE, timeout=30)
            await cp.send_command(INSTANCE, "turn.cancel", run_id="run-2", reason="test")
            assert (await cp.wait_for_command_status(cid, timeout=60))["status"] == "cancelled"
            check_instance(cp)  # every lossless event once: no id and no seq stored twice
            check_run(cp, "run-2", terminal="run.cancelled")
            assert (await turn(cp, "run-3", "Which word did I ask you to remember?"))["status"] == "completed"
            assert "TERN-4410" in last_model_request(fakes, runtime)  # the session was kept
            assert 1006 in [h["close_code"] for h in cp.link_history(INSTANCE)]
        finally:
            d.close()
