"""The keeper (driver/keeper/keeper.py) and its driver side (driver/keeper/kept.py) with a small shell provider: the
secret is required, a second driver replaces the first, output is replayed from any logged offset, the
input log names what was answered, the grace ends the tree, and the replay gate's rule (driver/keeper/reattach.py).
"""

from __future__ import annotations

import json
import os
import socket
import struct
from pathlib import Path

import anyio
import pytest

from driver.keeper import kept, reattach
from driver.keeper import state as keeper_state
from driver.keeper.kept import KeeperError, KeptProcess

ECHO = ["/bin/sh", "-c", 'while read -r l; do echo "got:$l"; done']
ENV = {"PATH": "/usr/bin:/bin"}

pytestmark = pytest.mark.skipif(not kept.supported(), reason="needs the PID namespace (bwrap)")


async def spawn(
    tmp: Path, argv: list[str] = ECHO, grace_ms: int = 30_000, log_max_bytes: int | None = None
) -> KeptProcess:
    (tmp / "cwd").mkdir(exist_ok=True)
    return await KeptProcess.spawn(
        argv, env=ENV, cwd=tmp / "cwd", state_dir=tmp, runtime="test", grace_ms=grace_ms, log_max_bytes=log_max_bytes
    )


async def read_until(proc: KeptProcess, needle: bytes) -> bytes:
    got = b""
    with anyio.fail_after(10):
        while needle not in got:
            got += await proc.stdout.receive()
    return got


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


async def test_output_is_logged_and_replayed_from_an_offset(tmp_path: Path) -> None:
    p = await spawn(tmp_path)
    try:
        await p.stdin.send(b"one\n")
        assert await read_until(p, b"got:one\n") == b"got:one\n"
        record = kept.read_record(tmp_path)
        assert record is not None and record.alive()
        # A second driver from offset 4 ("one\n" is 8 bytes: "got:one\n"): replaces the first.
        q = await KeptProcess.attach(tmp_path, record, offset=4)
        assert await read_until(q, b"one\n") == b"one\n"
        await q.stdin.send(b"two\n")
        assert await read_until(q, b"got:two\n") == b"got:two\n"
        with anyio.fail_after(10):
            await p.exited.wait()  # the first driver's connection was closed by the keeper
        assert (kept.keeper_dir(tmp_path) / "out.log").read_bytes() == b"got:one\ngot:two\n"
        assert (kept.keeper_dir(tmp_path) / "in.log").read_bytes() == b"one\ntwo\n"
        assert q.pid == p.pid and alive(q.pid)
        assert await q.terminate() in (0, -15)  # stdin closed (the loop ends), or SIGTERM
        assert not alive(record.keeper_pid)
        assert kept.read_record(tmp_path) is None
    finally:
        kept.discard(tmp_path)


async def test_a_wrong_secret_is_refused(tmp_path: Path) -> None:
    p = await spawn(tmp_path)
    try:
        record = kept.read_record(tmp_path)
        assert record is not None
        forged = kept.Record(
            record.bwrap_pid, record.keeper_pid, record.keeper_start, "00" * 16, record.runtime, record.fingerprint
        )
        with pytest.raises(KeeperError, match="refused"):
            await KeptProcess.attach(tmp_path, forged, offset=0)
        # Silence is refused too (no secret within the keeper's 5 s), without disturbing the driver.
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(kept.keeper_dir(tmp_path) / "sock"))
            s.sendall(struct.pack(">BI", ord("R"), 8) + struct.pack(">Q", 0))
            s.settimeout(10)
            head = s.recv(5)
            assert head[:1] == b"F"
        await p.stdin.send(b"still\n")
        assert b"got:still" in await read_until(p, b"got:still")
    finally:
        await p.terminate()


async def test_an_offset_past_the_log_is_refused(tmp_path: Path) -> None:
    p = await spawn(tmp_path)
    try:
        record = kept.read_record(tmp_path)
        assert record is not None
        q = await KeptProcess.attach(tmp_path, record, offset=10_000)
        with anyio.fail_after(10):
            await q.exited.wait()  # refused: it cannot reattach from there
            await p.exited.wait()  # and the authenticated newcomer had replaced the first driver
        assert q.returncode is not None
        assert alive(record.keeper_pid)  # the keeper itself carries on, for another driver
    finally:
        kept.discard(tmp_path)


async def test_no_driver_within_the_grace_ends_the_tree(tmp_path: Path) -> None:
    # The provider starts a tool in a session of its own: the namespace ends it too.
    argv = ["/bin/sh", "-c", "setsid sleep 300 & echo started; while read -r l; do :; done"]
    p = await spawn(tmp_path, argv, grace_ms=500)
    record = kept.read_record(tmp_path)
    assert record is not None
    await read_until(p, b"started")
    provider = p.pid
    p.detach()  # as a dead driver: nothing more from this side
    await p._stream.aclose()
    with anyio.fail_after(10):
        while alive(record.keeper_pid) or alive(provider):  # noqa: ASYNC110 (no event for another's exit)
            await anyio.sleep(0.05)
    sleepers = [pid for pid in os.listdir("/proc") if pid.isdigit() and _cmd(pid) == "sleep 300"]
    assert not [s for s in sleepers if _ppid_chain_has(int(s), record.bwrap_pid)]
    kept.discard(tmp_path)


def _cmd(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def _ppid_chain_has(pid: int, ancestor: int) -> bool:
    while pid > 1:
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:
            return False
        if pid == ancestor:
            return True
    return False


def test_the_input_log_names_answered_requests_and_the_next_id(tmp_path: Path) -> None:
    folder = kept.keeper_dir(tmp_path)
    folder.mkdir(parents=True)
    lines = [
        {"id": 0, "method": "initialize"},
        {"id": 7, "method": "turn/start"},
        {"id": 3, "result": {"decision": "accept"}},
        {"method": "initialized"},
        {"id": "s-1", "error": {"code": 1, "message": "no"}},
    ]
    (folder / "in.log").write_bytes(b"\n".join(json.dumps(m).encode() for m in lines) + b"\n{broken")
    assert kept.stdin_facts(tmp_path) == (8, {3, "s-1"})


def test_a_large_input_log_is_read_one_line_at_a_time(tmp_path: Path) -> None:
    """The input log holds what the driver wrote to the provider, file contents the agent had read
    included (up to the keeper's 512 MiB). A reattach read it into memory whole: every line holding
    `"id"` (stdin_facts), every decoded message (replies). 40 answers of 1 MiB: the peak stays a few."""
    import tracemalloc

    from driver.keeper.state import replies

    folder = kept.keeper_dir(tmp_path)
    folder.mkdir(parents=True)
    big = "x" * (1 << 20)
    with (folder / "in.log").open("wb") as f:
        for i in range(40):
            f.write(json.dumps({"id": i, "result": {"content": big}}).encode() + b"\n")
        f.write(json.dumps({"id": 99, "method": "session/prompt"}).encode() + b"\n")
    tracemalloc.start()
    try:
        assert kept.stdin_facts(tmp_path) == (100, set(range(40)))
        assert replies(tmp_path) == {i: {} for i in range(40)}
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"peak {peak >> 20} MiB"


def test_the_gate_suppresses_the_journaled_prefix_then_admits() -> None:
    class Proc:
        past = False

        def past_attach(self) -> bool:
            return self.past

    proc = Proc()
    plan = reattach.Plan(Path("/x"), None, "t", "run-1", 0, 0, frozenset())  # type: ignore[arg-type]
    plan.proc = proc  # type: ignore[assignment]
    gate = reattach.ReplayGate(2, plan)
    assert not gate.admits("message.started", "lossless")
    assert not gate.admits("message.delta", "best_effort")  # output from before the attach
    assert gate.admits("permission.requested", "lossless")  # not derived: never counted
    assert not gate.admits("message.completed", "lossless")
    assert not gate.replaying
    assert gate.admits("usage.updated", "lossless")
    proc.past = True
    assert gate.admits("message.delta", "best_effort")
    assert (gate.suppressed, gate.dropped_best_effort) == (2, 1)


def test_the_plan_continues_only_a_sent_turn_of_an_active_run_and_ends_an_unusable_keeper(tmp_path: Path) -> None:
    import subprocess

    from driver import containment
    from driver.keeper.state import write_json

    sleeper = subprocess.Popen(["sleep", "60"])  # stands for a keeper: alive, verifiable by start time
    try:
        start = containment.start_time(sleeper.pid)
        assert start is not None
        folder = kept.keeper_dir(tmp_path)
        folder.mkdir(parents=True)
        record = {"bwrap_pid": 0, "keeper_pid": sleeper.pid, "keeper_start": start, "nonce": "00" * 16}
        write_json(
            folder / "record.json", record | {"runtime": "openai-app-server", "fingerprint": keeper_state.fingerprint()}
        )
        write_json(folder / "turn.json", {"run_id": "run-1", "thread_id": "th-1", "offset": 10, "in_offset": 5})
        (folder / "in.log").write_bytes(b'{"id": 4, "method": "turn/start"}\n')

        plan = reattach.prepare(tmp_path, "openai-app-server", 1000, ["run-1"])
        assert plan is not None
        assert (plan.run_id, plan.offset, plan.thread_id, plan.first_id) == ("run-1", 10, "th-1", 5)
        assert reattach.take(tmp_path) is plan and reattach.take(tmp_path) is None
        # A run the journal does not hold active is not continued; the provider is attached at the log's end.
        plan = reattach.prepare(tmp_path, "openai-app-server", 1000, ["run-0"])
        assert plan is not None and (plan.run_id, plan.offset) == (None, None)
        # Marked, but its turn/start never reached the input log: not continued either.
        (folder / "in.log").write_bytes(b"12345")
        plan = reattach.prepare(tmp_path, "openai-app-server", 1000, ["run-1"])
        assert plan is not None and plan.run_id is None
        assert sleeper.poll() is None
        # Another runtime (or no grace): the keeper is ended and forgotten.
        assert reattach.prepare(tmp_path, "claude-agent-sdk", 1000, ["run-1"]) is None
        assert sleeper.wait(timeout=10) == -9
        assert kept.read_record(tmp_path) is None
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()


async def test_the_secret_is_in_no_argv_and_no_environment(tmp_path: Path) -> None:
    p = await spawn(tmp_path)
    try:
        record = kept.read_record(tmp_path)
        assert record is not None
        secret = record.secret.encode()
        for pid in (record.bwrap_pid, record.keeper_pid, p.pid):
            for name in ("cmdline", "environ"):
                try:
                    data = Path(f"/proc/{pid}/{name}").read_bytes()
                except PermissionError:
                    continue  # not dumpable: not even readable
                assert secret not in data and bytes.fromhex(record.secret) not in data, (pid, name)
        # Nor in any file: the record holds a nonce the secret is derived from under the journal key.
        for path in kept.keeper_dir(tmp_path).iterdir():
            if path.is_file():
                assert secret not in path.read_bytes() and bytes.fromhex(record.secret) not in path.read_bytes()
        assert oct((kept.keeper_dir(tmp_path) / "record.json").stat().st_mode & 0o777) == "0o600"
        assert oct((kept.keeper_dir(tmp_path) / "sock").stat().st_mode & 0o777) == "0o600"
    finally:
        await p.terminate()


async def test_a_malformed_frame_ends_the_connection_not_the_keeper(tmp_path: Path) -> None:
    p = await spawn(tmp_path)
    try:
        record = kept.read_record(tmp_path)
        assert record is not None
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(kept.keeper_dir(tmp_path) / "sock"))
            s.sendall(struct.pack(">BI", ord("A"), 32) + bytes.fromhex(record.secret))
            s.sendall(struct.pack(">BI", ord("R"), 3) + b"bad")  # an offset of 3 bytes
            s.settimeout(10)
            got = b""
            while b"malformed" not in got:
                chunk = s.recv(65536)
                assert chunk, got
                got += chunk
        assert record.alive() and alive(p.pid)
        q = await KeptProcess.attach(tmp_path, record, offset=None)
        await q.stdin.send(b"after\n")
        assert b"got:after" in await read_until(q, b"got:after")
        await q.terminate()
    finally:
        kept.discard(tmp_path)


def test_a_keeper_record_is_never_written_through_a_planted_link(tmp_path: Path) -> None:
    """Issue 30: `write_json` opened `<name>.tmp` with O_CREAT|O_TRUNC, following a link: one planted
    there (the keeper's folder is visible where containment is degraded) made the driver truncate and
    overwrite the file it named (its journal, say), then rename the link over the record. Now the
    temporary name is fresh (O_EXCL|O_NOFOLLOW): the target is untouched, the record a regular file
    that reads back, and no temporary file is left."""
    folder = kept.keeper_dir(tmp_path)
    folder.mkdir(parents=True)
    victim = tmp_path / "journal.db"
    victim.write_bytes(b"the driver's journal")
    (folder / "turn.tmp").symlink_to(victim)  # the temporary name the old code used
    keeper_state.write_json(folder / "turn.json", {"run_id": "run-1", "thread_id": "t", "offset": 0})
    assert victim.read_bytes() == b"the driver's journal"
    assert not (folder / "turn.json").is_symlink()
    assert keeper_state.read_json(folder / "turn.json") == {"run_id": "run-1", "thread_id": "t", "offset": 0}
    assert (folder / "turn.json").stat().st_mode & 0o777 == 0o600
    # A link at the record's own name is replaced, not followed.
    (folder / "host.json").symlink_to(victim)
    keeper_state.write_json(folder / "host.json", {"port": 1, "token": "t"})
    assert victim.read_bytes() == b"the driver's journal" and not (folder / "host.json").is_symlink()
    assert sorted(p.name for p in folder.iterdir() if not p.is_symlink()) == ["host.json", "turn.json"]


def test_a_keeper_file_the_driver_did_not_write_is_not_acted_on(tmp_path: Path) -> None:
    """PROTOCOL §9: record.json names a pid the next driver may SIGKILL; one without the driver's MAC
    (edited, or written under another key) is ignored and reported, like processes.json."""
    import json
    import subprocess

    from driver import containment
    from driver.queue.rowmac import RowMac, derive_key

    containment.take_findings()
    sleeper = subprocess.Popen(["sleep", "60"])  # stands for a process the agent wants killed
    try:
        start = containment.start_time(sleeper.pid)
        folder = kept.keeper_dir(tmp_path)
        folder.mkdir(parents=True)
        record = {"bwrap_pid": 0, "keeper_pid": sleeper.pid, "keeper_start": start, "nonce": "00" * 16}
        keeper_state.use_mac(RowMac(derive_key("token", "inst")))
        keeper_state.write_json(
            folder / "record.json", record | {"runtime": "openai-app-server", "fingerprint": keeper_state.fingerprint()}
        )
        assert kept.read_record(tmp_path) is not None  # the driver's own file passes
        raw = json.loads((folder / "record.json").read_text())
        raw["value"]["keeper_pid"] = 1
        (folder / "record.json").write_text(json.dumps(raw))
        assert kept.read_record(tmp_path) is None
        (folder / "record.json").write_text(
            json.dumps(record | {"runtime": "openai-app-server", "fingerprint": keeper_state.fingerprint()})
        )  # no MAC
        assert reattach.prepare(tmp_path, "claude-agent-sdk", 1000, ["run-1"]) is None
        assert sleeper.poll() is None, "a forged record made the driver kill a process"
        keeper_state.write_json(
            folder / "record.json", record | {"runtime": "openai-app-server", "fingerprint": keeper_state.fingerprint()}
        )
        keeper_state.use_mac(RowMac(derive_key("other", "inst")))  # another key: not this driver's
        assert kept.read_record(tmp_path) is None
        assert [(f.table, f.key, f.reason) for f in containment.take_findings()] == [
            ("keeper", "record.json", "mac")
        ] * 3
        # turn.json names the run a successor continues and the output it re-reads: the same check.
        keeper_state.write_json(folder / "turn.json", {"run_id": "run-1", "thread_id": "t", "offset": 0})
        assert kept.read_turn(tmp_path) is not None
        (folder / "turn.json").write_text(json.dumps({"run_id": "run-9", "thread_id": "t", "offset": 0}))
        assert kept.read_turn(tmp_path) is None
        assert [(f.table, f.key) for f in containment.take_findings()] == [("keeper", "turn.json")]
    finally:
        keeper_state.use_mac(keeper_state.UNKEYED)
        sleeper.kill()
        sleeper.wait()


async def test_a_state_dir_past_the_socket_path_limit_still_keeps_and_attaches(tmp_path: Path) -> None:
    # A control plane's mktemp tree can make state_dir/driver/keeper/sock longer than sun_path's 107 bytes.
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    assert len(os.fsencode(kept.keeper_dir(deep) / "sock")) > 107
    p = await spawn(deep)
    try:
        await p.stdin.send(b"one\n")
        assert await read_until(p, b"got:one\n") == b"got:one\n"
        assert (kept.keeper_dir(deep) / "sock").is_socket()  # where §9 hides it, not elsewhere
        record = kept.read_record(deep)
        assert record is not None
        q = await KeptProcess.attach(deep, record, offset=0)
        assert await read_until(q, b"got:one\n") == b"got:one\n"
        assert q.pid == p.pid
        await q.terminate()
    finally:
        kept.discard(deep)


async def test_a_keeper_configured_by_another_payload_is_not_adopted(tmp_path: Path) -> None:
    """PROTOCOL §8.2: the record carries a keyed fingerprint of what configured the provider; a successor
    whose boot payload differs (here: the model) ends the kept tree instead of adopting it."""
    import msgspec

    from driver.protocol.boot import BootPayload

    def payload(model: str) -> BootPayload:
        raw = {
            "protocol": 1,
            "driver_instance_id": "drv-1",
            "control": {"url": "ws://127.0.0.1:1/driver", "token": "t"},
            "session": {"id": "s", "agent_id": "a", "kind": "cattle", "cwd": str(tmp_path), "state_dir": str(tmp_path)},
            "execution": {"revision": "r", "runtime": "openai-app-server", "model": model},
        }
        return msgspec.convert(raw, BootPayload)

    keeper_state.use_payload(payload("gpt-a"))
    p = await spawn(tmp_path)
    try:
        record = kept.read_record(tmp_path)
        assert record is not None and record.alive()
        p.mark_turn("run-1", "th-1")
        keeper_state.use_payload(payload("gpt-b"))
        assert reattach.prepare(tmp_path, "test", 1000, ["run-1"]) is None
        assert kept.read_record(tmp_path) is None
        with anyio.fail_after(5):
            while record.alive() and not keeper_state.zombie(record.keeper_pid):  # noqa: ASYNC110 (polling /proc)
                await anyio.sleep(0.02)
    finally:
        keeper_state.use_payload(payload("gpt-a"))
        await p.terminate()
        keeper_state._configured = b""


async def test_a_full_input_log_says_so_and_is_never_reattached(tmp_path: Path) -> None:
    """PROTOCOL §8.2: past its bound the input log takes nothing more (no holes), the driver is told
    (`keeper.log_full`), and a successor's attach is refused instead of answering from it."""
    keeper_state.take_notices()
    p = await spawn(tmp_path, log_max_bytes=16)
    try:
        await p.stdin.send(b"one\n")
        await p.stdin.send(b"a line too long for the log\n")
        await p.stdin.send(b"two\n")  # smaller, but after the gap: not logged either
        await read_until(p, b"got:two\n")  # the provider got every line; the keeper's frames came before
        notices = keeper_state.take_notices()
        assert {"log": "in", "limit": 16, "refused": False} in [n["details"] for n in notices], notices
        assert {n["code"] for n in notices} == {"keeper.log_full"}
        assert (kept.keeper_dir(tmp_path) / "in.log").read_bytes() == b"one\n"
        record = kept.read_record(tmp_path)
        assert record is not None
        with pytest.raises(KeeperError, match="filled up"):
            await KeptProcess.attach(tmp_path, record, offset=None)
        assert keeper_state.take_notices()[0]["details"]["refused"] is True
    finally:
        await p.terminate()
