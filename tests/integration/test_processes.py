"""PROTOCOL §6.8 through the real driver process and the reference control plane: terminals and
pipes beside the agent, their output with offsets, replay, and their ends."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import anyio
import pytest

from tests.integration.harness import INSTANCE, DriverProcess, boot_payload, control_plane
from tests.integration.processes_support import (
    alive,
    cmdline,
    command,
    descendants,
    output_events,
    screen,
    start_driver,
    start_process,
    wait_exited,
    wait_output,
)

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("mode", ["auto", "subreaper", "none"])  # every containment the driver may pick
async def test_pty_echo_and_resize_seen_by_stty(mode: str, tmp_path: Path, drivers: list[DriverProcess]) -> None:
    async with control_plane(tmp_path) as cp:
        d = DriverProcess(tmp_path, boot_payload(tmp_path, cp.url), extra_env={"AGENT_DRIVER_CONTAINMENT": mode})
        drivers.append(d)
        await cp.wait_connected(INSTANCE, timeout=20)
        st = await start_process(cp, "term-1", argv=["/bin/sh"], pty={"cols": 100, "rows": 30})
        assert st["result"]["pid"] > 0
        started = await cp.wait_for_event(INSTANCE, lambda e: True, kinds="process.started")
        assert started["payload"]["pty"] == {"cols": 100, "rows": 30} and started["delivery"] == "lossless"
        assert (await command(cp, "process.input", process_id="term-1", data="stty size\n"))["status"] == "completed"
        await wait_output(cp, "term-1", "30 100")
        assert (await command(cp, "process.resize", process_id="term-1", cols=132, rows=50))["status"] == "completed"
        await command(cp, "process.input", process_id="term-1", data="stty size; echo ok-$((6*7))\n")
        out = await wait_output(cp, "term-1", "ok-42")
        assert "50 132" in out
        await command(cp, "process.input", process_id="term-1", data="exit 3\n")
        exited = await wait_exited(cp, "term-1")
        assert exited["exit_code"] == 3 and exited["signal"] is None, exited["tail"]
        assert "ok-42" in exited["tail"]
        text, gaps = screen(cp, "term-1")
        assert gaps == [] and len(text.encode()) == exited["output_bytes"]


async def test_pipes_carry_stderr_and_exit_codes_and_signals(tmp_path: Path, drivers: list[DriverProcess]) -> None:
    async with control_plane(tmp_path) as cp:
        start_driver(tmp_path, cp.url, drivers)
        await cp.wait_connected(INSTANCE, timeout=20)
        await start_process(cp, "p-exit", argv=["sh", "-c", "echo to-out; echo to-err >&2; exit 7"])
        exited = await wait_exited(cp, "p-exit")
        assert (exited["exit_code"], exited["signal"]) == (7, None)
        text, gaps = screen(cp, "p-exit")
        # One stream, in the order written: stdout and stderr share the pipe.
        assert text == "to-out\nto-err\n" and gaps == [] and exited["output_bytes"] == len(text)
        assert exited["tail"] == text

        await start_process(cp, "p-self", argv=["sh", "-c", "kill -TERM $$"])
        exited = await wait_exited(cp, "p-self")
        assert (exited["exit_code"], exited["signal"]) == (None, "TERM")

        await start_process(cp, "p-sleep", argv=["sleep", "300"])
        st = await command(cp, "process.signal", process_id="p-sleep", signal="KILL")
        assert st["status"] == "completed"
        exited = await wait_exited(cp, "p-sleep")
        assert (exited["exit_code"], exited["signal"]) == (None, "KILL")
        # Signalling what has exited is not an error; input to it is.
        st = await command(cp, "process.signal", process_id="p-sleep", signal="TERM")
        assert st["status"] == "completed" and st["result"] == {"already_exited": True}
        st = await command(cp, "process.input", process_id="p-sleep", data="x")
        assert st["status"] == "failed" and st["error"]["code"] == "process.not_running"

        # Ctrl-C reaches a job in a terminal: the foreground group gets SIGINT.
        await start_process(cp, "t-int", argv=["sh", "-c", "echo armed; exec sleep 300"], pty={"cols": 80, "rows": 24})
        await wait_output(cp, "t-int", "armed")
        await command(cp, "process.signal", process_id="t-int", signal="INT")
        exited = await wait_exited(cp, "t-int")
        assert exited["signal"] == "INT"
        assert len(cp.events(INSTANCE, "process.exited")) == 4  # each once


async def test_bad_process_commands_are_refused_by_name(tmp_path: Path, drivers: list[DriverProcess]) -> None:
    async with control_plane(tmp_path) as cp:
        start_driver(tmp_path, cp.url, drivers)
        await cp.wait_connected(INSTANCE, timeout=20)

        async def refused(kind: str, **fields: object) -> tuple[str, str]:
            st = await command(cp, kind, **fields)
            assert st["status"] == "failed", st
            return st["error"]["code"], st["error"]["message"]

        assert (await refused("process.input", process_id="nope", data="x"))[0] == "process.not_found"
        code, message = await refused("process.start", process_id="a/b")
        assert code == "command.invalid" and "process_id" in message
        code, message = await refused("process.signal", process_id="x", signal="STOP")
        assert code == "command.invalid" and "signal" in message
        code, message = await refused("process.start", process_id="x", argv=["no-such-program-xyz"])
        assert code == "process.spawn_failed" and "no-such-program-xyz" in message
        code, _ = await refused("process.resize", process_id="x", cols=0, rows=10)
        assert code == "command.invalid"
        await start_process(cp, "pipes", argv=["sleep", "300"])
        assert (await refused("process.start", process_id="pipes", argv=["true"]))[0] == "process.exists"
        assert (await refused("process.resize", process_id="pipes", cols=10, rows=10))[0] == "process.not_a_terminal"
        code, message = await refused("process.replay", process_id="pipes", from_offset=10)
        assert code == "process.offset_ahead" and "0 bytes" in message
        await command(cp, "process.signal", process_id="pipes", signal="KILL")
        await wait_exited(cp, "pipes")
        # An id whose process has exited may be used again: a new output from offset 0.
        await start_process(cp, "pipes", argv=["sh", "-c", "printf again"])
        await cp.wait_until(lambda: len(cp.events(INSTANCE, "process.exited")) == 2, timeout=20)
        outputs = [e["payload"] for e in cp.events(INSTANCE, "process.output")]
        assert outputs[-1] == {"process_id": "pipes", "offset": 0, "data": "again", "truncated_before": False}


async def test_utf8_text_with_invalid_bytes_and_raw_offsets(tmp_path: Path, drivers: list[DriverProcess]) -> None:
    async with control_plane(tmp_path) as cp:
        start_driver(tmp_path, cp.url, drivers)
        await cp.wait_connected(INSTANCE, timeout=20)
        # é is two bytes, \377 is no UTF-8 at all; the second printf comes in a separate write.
        script = r"printf 'caf\303'; sleep 0.2; printf '\251 \377!'"
        await start_process(cp, "u", argv=["sh", "-c", script])
        exited = await wait_exited(cp, "u")
        assert exited["output_bytes"] == 8
        stored = cp.events(INSTANCE, "process.output")
        assert {e["delivery"] for e in stored} == {"best_effort"} and all(e["run_id"] is None for e in stored)
        assert [e["delivery"] for e in cp.events(INSTANCE, "process.exited")] == ["lossless"]
        events = [e["payload"] for e in stored]
        assert "".join(e["data"] for e in events) == "café \ufffd!"
        # A character is never split over two events, and each offset counts raw bytes.
        assert [(e["offset"], e["data"]) for e in events] in ([(0, "caf"), (3, "é \ufffd!")], [(0, "café \ufffd!")])


async def test_a_link_cut_then_an_exact_replay(tmp_path: Path, drivers: list[DriverProcess]) -> None:
    # In cwd: the boot file's folder (tmp_path) is hidden from the provider's tree (PROTOCOL §9).
    (tmp_path / "cwd").mkdir(exist_ok=True)
    go, done = tmp_path / "cwd" / "go.fifo", tmp_path / "cwd" / "done.fifo"
    os.mkfifo(go)
    os.mkfifo(done)
    expected = "before\n" + "".join(f"{i}\n" for i in range(1, 40001))
    async with control_plane(tmp_path) as cp:
        start_driver(tmp_path, cp.url, drivers)
        await cp.wait_connected(INSTANCE, timeout=20)
        script = f"echo before; cat {go} >/dev/null; seq 1 40000; echo done > {done}; exec sleep 300"
        await start_process(cp, "p", argv=["sh", "-c", script])
        await wait_output(cp, "p", "before\n")
        await cp.stop(1012)  # the link is down while the process writes
        reader = os.open(done, os.O_RDONLY | os.O_NONBLOCK)
        try:
            os.close(os.open(go, os.O_WRONLY))  # `cat` sees EOF: the output starts
            with anyio.fail_after(20):
                await anyio.wait_readable(reader)
            assert os.read(reader, 16) == b"done\n"
        finally:
            os.close(reader)
        await cp.start()
        await cp.wait_connected(INSTANCE, timeout=20)
        seen, gaps = screen(cp, "p")
        assert seen != expected  # nothing written while the CP was down was stored
        # The console asks for everything after the end of what it shows.
        held = len(seen.encode()) if not gaps else gaps[0][0]
        st = await command(cp, "process.replay", process_id="p", from_offset=held)
        assert st["status"] == "completed"
        assert st["result"] == {"from_offset": held, "to_offset": len(expected), "truncated_before": False}
        await cp.wait_until(lambda: screen(cp, "p")[0] == expected, timeout=20)
        assert screen(cp, "p")[1] == []


async def test_a_replay_past_the_ring_says_truncated_before(tmp_path: Path, drivers: list[DriverProcess]) -> None:
    size = 3 * 1024 * 1024 + 5
    async with control_plane(tmp_path) as cp:
        start_driver(tmp_path, cp.url, drivers)
        await cp.wait_connected(INSTANCE, timeout=20)
        await start_process(cp, "big", argv=["sh", "-c", f"head -c {size} /dev/zero | tr '\\0' a"])
        exited = await wait_exited(cp, "big", timeout=60)
        assert exited["output_bytes"] == size and exited["tail"] == "a" * 4096
        before = len(cp.events(INSTANCE, "process.output"))
        st = await command(cp, "process.replay", process_id="big", from_offset=0)
        oldest = size - 1024 * 1024
        assert st["result"] == {"from_offset": oldest, "to_offset": size, "truncated_before": True}
        await cp.wait_until(lambda: len(cp.events(INSTANCE, "process.output")) > before, timeout=20)
        await cp.wait_until(
            lambda: sum(len(e["data"]) for e in output_events(cp, "big")[before:]) >= 1024 * 1024, timeout=30
        )
        replayed = output_events(cp, "big")[before:]
        assert replayed[0]["offset"] == oldest and replayed[0]["truncated_before"] is True
        assert all(not e["truncated_before"] for e in replayed[1:])
        at = oldest
        for e in replayed:
            assert e["offset"] == at and set(e["data"]) == {"a"}
            at += len(e["data"])
        assert at == size
        # The ring is the newest 1 MiB (in 4 KiB blocks, one more than that), in the driver's hidden folder,
        # with a MAC per block and its trailer (driver/processes/ringfile.py).
        rings = list((tmp_path / "state" / "driver" / "processes").glob("*.ring"))
        slots = 1024 * 1024 // 4096 + 1
        assert len(rings) == 1 and rings[0].stat().st_size == slots * (4096 + 32) + 16 + 32


async def test_environment_and_cwd_admission(tmp_path: Path, drivers: list[DriverProcess]) -> None:
    (tmp_path / "cwd" / "sub").mkdir(parents=True)
    async with control_plane(tmp_path) as cp:
        payload = boot_payload(tmp_path, cp.url)
        payload["execution"]["environment"]["SHARED_SETTING"] = "visible-1"
        payload["execution"]["model_proxy"] = {"secrets": ["FAKE_PROVIDER_KEY"]}
        d = DriverProcess(tmp_path, payload, extra_env={"DRIVER_OWN_VARIABLE": "driver-only-9"})
        drivers.append(d)
        await cp.wait_connected(INSTANCE, timeout=20)
        script = 'pwd; echo "[$SHARED_SETTING][$FAKE_PROVIDER_KEY][$DRIVER_OWN_VARIABLE][$EXTRA][$HOME]"'
        await start_process(cp, "env", argv=["sh", "-c", script], cwd="sub", env={"EXTRA": "added-2"})
        await wait_exited(cp, "env")
        text, _ = screen(cp, "env")
        home = tmp_path / "state" / "providers" / "acp" / "home"
        assert text == f"{tmp_path / 'cwd' / 'sub'}\n[visible-1][][][added-2][{home}]\n"

        async def refused(**fields: object) -> dict[str, str]:
            st = await command(cp, "process.start", argv=["true"], **fields)
            assert st["status"] == "failed", st
            return dict(st["error"])

        assert (await refused(process_id="out", cwd="/etc"))["code"] == "path.not_allowed"
        assert (await refused(process_id="up", cwd="../"))["code"] == "path.not_allowed"
        assert (await refused(process_id="file", cwd=str(d.boot.parent / "cp.sqlite3")))["code"] == "path.not_allowed"
        error = await refused(process_id="sec", env={"FAKE_PROVIDER_KEY": "x"})
        assert error["code"] == "process.env_refused" and "FAKE_PROVIDER_KEY" in error["message"]
        assert "provider-secret-777" not in error["message"]


async def test_at_most_sixteen_at_once(tmp_path: Path, drivers: list[DriverProcess]) -> None:
    async with control_plane(tmp_path) as cp:
        start_driver(tmp_path, cp.url, drivers)
        await cp.wait_connected(INSTANCE, timeout=20)
        # Seventeen at once, and one id twice: the checks hold while starts are under way together.
        ids = [f"s{i}" for i in range(17)] + ["s0"]
        sent = [(await cp.send_command(INSTANCE, "process.start", process_id=i, argv=["sleep", "300"]))[0] for i in ids]
        statuses = [await cp.wait_for_command_status(cid, timeout=30) for cid in sent]
        failed = [(ids[n], st["error"]["code"]) for n, st in enumerate(statuses) if st["status"] == "failed"]
        assert sorted(code for _, code in failed) == ["process.exists", "process.limit"]
        assert all(
            st["error"]["retryable"] for st in statuses if (st.get("error") or {}).get("code") == "process.limit"
        )
        # (a status's fast frame may come before the event it follows: wait for the events)
        await cp.wait_until(lambda: len(cp.events(INSTANCE, "process.started")) >= 16, timeout=20)
        assert len(cp.events(INSTANCE, "process.started")) == 16
        running = {e["payload"]["process_id"] for e in cp.events(INSTANCE, "process.started")}
        spare = next(i for i in ids if i not in running)
        await cp.wait_until(lambda: len((cp.last_heartbeat(INSTANCE) or {}).get("processes", [])) == 16, timeout=10)
        listed = cp.last_heartbeat(INSTANCE)["processes"]  # type: ignore[index]
        assert {p["process_id"] for p in listed} == running
        assert all(p["pid"] > 0 and p["running_ms"] >= 0 for p in listed)
        gone = sorted(running)[3]
        await command(cp, "process.signal", process_id=gone, signal="KILL")
        await wait_exited(cp, gone)
        await start_process(cp, spare, argv=["sleep", "300"])


async def test_processes_survive_a_cancel_and_a_reset_and_session_stop_ends_them(
    tmp_path: Path, drivers: list[DriverProcess]
) -> None:
    async with control_plane(tmp_path) as cp:
        d = start_driver(tmp_path, cp.url, drivers)
        await cp.wait_connected(INSTANCE, timeout=20)
        await start_process(cp, "plain", argv=["sleep", "300"])
        # One that ignores SIGTERM (and so does the sleep it becomes): only the KILL after 3 s ends it.
        await start_process(cp, "stubborn", argv=["sh", "-c", "trap '' TERM; echo armed; exec sleep 300"])
        await wait_output(cp, "stubborn", "armed")
        run, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": "[[slow]]"})
        await cp.wait_for_event(INSTANCE, lambda e: e["run_id"] == "run-1", kinds="run.started")
        await command(cp, "turn.cancel", run_id="run-1", reason="user")
        assert (await cp.wait_for_command_status(run, timeout=20))["status"] == "cancelled"
        reset = await command(cp, "session.reset", reason="fresh")
        assert reset["status"] == "completed"
        # Untouched by the cancel and the reset: still running, still answering.
        assert cp.events(INSTANCE, "process.exited") == []
        beat_ids = {p["process_id"] for p in (cp.last_heartbeat(INSTANCE) or {}).get("processes", [])}
        assert beat_ids <= {"plain", "stubborn"}
        st = await command(cp, "process.signal", process_id="plain", signal="HUP")
        assert st["status"] == "completed" and st["result"] == {}
        plain = await wait_exited(cp, "plain")
        assert plain["signal"] == "HUP"

        # Once it runs (a TERM during the containment's first microseconds would find it still ignored).
        await start_process(cp, "plain2", argv=["sh", "-c", "echo up; exec sleep 300"])
        await wait_output(cp, "plain2", "up")
        stop, _ = await cp.send_command(INSTANCE, "session.stop", reason="done")
        assert (await cp.wait_for_command_status(stop, timeout=30))["status"] == "completed"
        assert await d.wait(timeout=30) == 0
        ends = {e["payload"]["process_id"]: e["payload"] for e in cp.events(INSTANCE, "process.exited")}
        assert ends["plain2"]["signal"] == "TERM" and ends["stubborn"]["signal"] == "KILL"
        # Every process.exited was stored before the stop completed (they are lossless).
        stored = [e["kind"] for e in cp.events(INSTANCE)]
        assert stored.index("process.exited") < len(stored) - 1


async def test_a_start_still_spawning_when_the_stop_arrives_is_ended_and_reported(
    tmp_path: Path, drivers: list[DriverProcess]
) -> None:
    """process.start and session.stop back to back: the start is either refused (driver.stopping) or
    its process is TERMed by the stop and its process.exited stored before the driver exits."""
    async with control_plane(tmp_path) as cp:
        d = start_driver(tmp_path, cp.url, drivers)
        await cp.wait_connected(INSTANCE, timeout=20)
        starts = [
            (await cp.send_command(INSTANCE, "process.start", process_id=f"late-{i}", argv=["sleep", "300"]))[0]
            for i in range(3)
        ]
        stop, _ = await cp.send_command(INSTANCE, "session.stop", reason="done")
        assert (await cp.wait_for_command_status(stop, timeout=30))["status"] == "completed"
        assert await d.wait(timeout=30) == 0
        outcomes = [await cp.wait_for_command_status(cid, timeout=5) for cid in starts]
        started = {e["payload"]["process_id"]: e["payload"]["pid"] for e in cp.events(INSTANCE, "process.started")}
        exited = {e["payload"]["process_id"]: e["payload"] for e in cp.events(INSTANCE, "process.exited")}
        for i, status in enumerate(outcomes):
            pid = f"late-{i}"
            if status["status"] == "completed":
                # TERM, or the KILL 3 s on if the TERM came in the containment's first microseconds.
                assert pid in started and exited[pid]["signal"] in ("TERM", "KILL"), (status, exited)
                assert not alive(started[pid])
            else:
                assert status["error"]["code"] == "driver.stopping" and pid not in started, status
        assert set(exited) == set(started)


@pytest.mark.parametrize("mode", ["auto", "subreaper"])  # auto is the PID namespace here
async def test_processes_die_with_a_sigkilled_driver(mode: str, tmp_path: Path, drivers: list[DriverProcess]) -> None:
    (tmp_path / "cwd").mkdir(exist_ok=True)  # not beside the boot file: that folder is hidden (§9)
    up = tmp_path / "cwd" / "up.fifo"
    os.mkfifo(up)
    reader = os.open(up, os.O_RDONLY | os.O_NONBLOCK)
    async with control_plane(tmp_path) as cp:
        d = DriverProcess(tmp_path, boot_payload(tmp_path, cp.url), extra_env={"AGENT_DRIVER_CONTAINMENT": mode})
        drivers.append(d)
        await cp.wait_connected(INSTANCE, timeout=20)
        await start_process(cp, "shell", argv=["sh"], pty={"cols": 80, "rows": 24})
        # Its prompt is stored before the kill (a loaded machine can take a while to start the shell).
        await cp.wait_until(lambda: screen(cp, "shell")[0] != "", 20)
        # A part that leaves every group and session (setsid), then says "up" through the FIFO.
        script = f"setsid sleep 309.5 & echo up > {up}; exec sleep 310.5"
        await start_process(cp, "server", argv=["sh", "-c", script])
        try:
            with anyio.fail_after(20):
                await anyio.wait_readable(reader)
            assert os.read(reader, 16) == b"up\n"
        finally:
            os.close(reader)
        tree = descendants(d.pid)
        assert any(b"309.5" in cmdline(p) for p in tree) and any(b"310.5" in cmdline(p) for p in tree)
        watch = {p: os.pidfd_open(p) for p in tree if alive(p)}
        os.kill(d.pid, signal.SIGKILL)  # the driver alone
        d.proc.wait()
        try:
            with anyio.move_on_after(5):
                for fd in watch.values():
                    await anyio.wait_readable(fd)  # readable once its process exited
        finally:
            for fd in watch.values():
                os.close(fd)
        left = {p: cmdline(p) for p in watch if alive(p)}
        assert not left
        assert cp.events(INSTANCE, "process.exited") == []
        # The next driver process on the state_dir ends each of them once, as they ended: by SIGKILL.
        again = DriverProcess(tmp_path, boot_payload(tmp_path, cp.url), "again")
        drivers.append(again)
        await cp.wait_until(lambda: len(cp.events(INSTANCE, "process.exited")) == 2, timeout=30)
        ends = {e["payload"]["process_id"]: e["payload"] for e in cp.events(INSTANCE, "process.exited")}
        assert ends.keys() == {"shell", "server"}
        assert all((e["exit_code"], e["signal"]) == (None, "KILL") for e in ends.values())
        text, _ = screen(cp, "server")
        assert ends["server"]["output_bytes"] == len(text.encode()) == 0
        assert ends["shell"]["output_bytes"] > 0 and ends["shell"]["tail"] == screen(cp, "shell")[0]
        await cp.wait_for_event(INSTANCE, lambda e: e["epoch"] == 2, kinds="driver.started", timeout=30)
        assert len(cp.events(INSTANCE, "process.exited")) == 2
