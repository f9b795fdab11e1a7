"""The protocol logic of PROTOCOL §6.8 without I/O: the ring's arithmetic, replay plans, UTF-8 framing,
and what a process.start becomes."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from driver.processes.output import PACE_EVENTS, must_wait
from driver.processes.ring import Piece, chunk_ranges, oldest_kept, pieces, plan_replay
from driver.processes.ringfile import RingFile, leftovers
from driver.processes.spec import SpecError, argv_of, env_of, exit_info
from driver.processes.text import chunk_limit, complete_length, decode, live_split, output_chunks, tail_of


def test_pieces_wrap_at_the_end_of_the_ring() -> None:
    assert pieces(0, 10, 16) == [Piece(0, 10)]
    assert pieces(12, 10, 16) == [Piece(12, 4), Piece(0, 6)]
    assert pieces(32, 16, 16) == [Piece(0, 16)]
    assert pieces(5, 0, 16) == []
    with pytest.raises(ValueError):
        pieces(0, 17, 16)


def test_replay_plans() -> None:
    assert plan_replay(0, 10, 16) == (0, 10, False)
    assert plan_replay(4, 10, 16) == (4, 10, False)
    assert plan_replay(0, 40, 16) == (24, 40, True)
    assert plan_replay(30, 40, 16) == (30, 40, False)
    assert plan_replay(40, 40, 16) == (40, 40, False)
    assert oldest_kept(40, 16) == 24
    assert chunk_ranges(3, 10, 4) == [(3, 7), (7, 10)]


@given(st.lists(st.binary(min_size=0, max_size=40), max_size=30), st.integers(0, 200))
def test_the_ring_file_holds_exactly_the_newest_bytes(
    tmp_path_factory: pytest.TempPathFactory, writes: list[bytes], start: int
) -> None:
    ring = RingFile(tmp_path_factory.mktemp("ring"), "p", 1, capacity=64)
    whole = b""
    for w in writes:
        assert ring.append(w) == len(whole)
        whole += w
    assert ring.total == len(whole)
    plan = plan_replay(min(start, len(whole)), len(whole), 64)
    assert ring.read(plan.start, plan.end) == whole[plan.start : plan.end]
    assert plan.start == max(min(start, len(whole)), len(whole) - 64)
    ring.close(remove=True)
    assert not ring.path.exists()


@given(st.text(max_size=50), st.integers(4, 12))
def test_framing_never_splits_a_character(text: str, cut: int) -> None:
    # Reads of `cut` bytes, each sent up to its complete length (the rest waits for the next read):
    # the decoded events join to the text itself, with no U+FFFD from a split character.
    raw, pending, out = text.encode(), b"", []
    for i in range(0, len(raw), cut):
        buf = pending + raw[i : i + cut]
        n = complete_length(buf)
        out.append(decode(buf[:n]))
        pending = buf[n:]
    out.append(decode(pending))
    assert "".join(out) == text


def test_complete_length_holds_back_only_an_unfinished_character() -> None:
    assert complete_length(b"caf\xc3") == 3
    assert complete_length(b"caf\xc3\xa9") == 5
    assert complete_length(b"\xe2\x82") == 0
    assert complete_length(b"\xe2\x82\xac") == 3
    assert complete_length(b"ab\xff") == 3  # invalid: nothing to wait for
    assert complete_length(b"\x80\x80\x80\x80") == 4
    assert decode(b"a\xffb") == "a\ufffdb"


def test_tails_start_at_a_character_when_cut() -> None:
    assert tail_of(b"\xa9 ok", cut=True) == " ok"
    assert tail_of(b"\xa9 ok", cut=False) == "\ufffd ok"


def test_a_chunk_never_needs_the_oversize_cut() -> None:
    assert chunk_limit(262_144) * 6 + 256 <= 262_144
    assert chunk_limit(1024) >= 64


def test_argv_and_the_login_shell() -> None:
    assert argv_of(["ls", "-l"], {}, "/bin/bash") == ["ls", "-l"]
    assert argv_of([], {"SHELL": "/bin/zsh"}, "/bin/bash") == ["/bin/zsh", "-l"]
    assert argv_of([], {}, "/bin/bash") == ["/bin/bash", "-l"]
    assert argv_of([], {}, None) == ["/bin/sh", "-l"]
    with pytest.raises(SpecError, match="NUL"):
        argv_of(["a\0b"], {}, None)


def test_env_withholds_secrets_and_driver_variables() -> None:
    base = {"PATH": "/bin", "OPENAI_API_KEY": "sk-1", "TERM": "dumb"}
    env = env_of(base, {"X": "1"}, ["OPENAI_API_KEY"], pty=True)
    assert env == {"PATH": "/bin", "TERM": "xterm-256color", "X": "1"}
    assert env_of(base, {"TERM": "vt100"}, [], pty=True)["TERM"] == "vt100"
    assert env_of(base, {}, [], pty=False)["TERM"] == "dumb"
    for key in ("OPENAI_API_KEY", "AGENT_DRIVER_CONTROL_TOKEN"):
        with pytest.raises(SpecError) as exc:
            env_of(base, {key: "v"}, ["OPENAI_API_KEY"], pty=False)
        assert exc.value.code == "process.env_refused" and "v" not in exc.value.message.split(key)[1]
    with pytest.raises(SpecError, match="name"):
        env_of(base, {"A=B": "v"}, [], pty=False)


def test_exit_info() -> None:
    assert exit_info(0) == (0, None)
    assert exit_info(3) == (3, None)
    assert exit_info(-signal.SIGKILL) == (None, "KILL")
    assert exit_info(-signal.SIGTERM) == (None, "TERM")


def test_ring_file_is_private(tmp_path: Path) -> None:
    ring = RingFile(tmp_path, "term/../x", 2, pid=123)
    assert ring.path.parent == tmp_path and ring.path.stat().st_mode & 0o077 == 0
    assert ring.record.stat().st_mode & 0o077 == 0


def test_a_dead_drivers_rings_say_what_ran_and_how_much_it_wrote(tmp_path: Path) -> None:
    quiet = RingFile(tmp_path, "quiet", 1, pid=10)
    loud = RingFile(tmp_path, "loud", 2, capacity=8192, pid=11)
    done = RingFile(tmp_path, "done", 3, pid=12)
    loud.append(b"x" * 5000 + "é".encode() + b"y" * 5000)
    done.append(b"bye")
    done.ended()  # its process.exited was admitted
    for ring in (quiet, loud, done):
        ring.close()  # the driver died: nothing else happens to them
    found = {left.process_id: left for left in leftovers(tmp_path)}
    assert found.keys() == {"quiet", "loud"}
    assert (found["quiet"].output_bytes, found["quiet"].tail, found["quiet"].cut) == (0, b"", False)
    assert found["loud"].output_bytes == 10_002 and found["loud"].tail == b"y" * 4096 and found["loud"].cut
    (tmp_path / "junk.json").write_text("{not json")
    assert len(leftovers(tmp_path)) == 2


@given(st.text(), st.integers(min_value=4, max_value=64), st.booleans())
def test_output_chunks_cover_the_data_in_order_and_never_split_a_character(
    text: str, limit: int, truncated: bool
) -> None:
    data = text.encode()
    chunks = list(output_chunks(data, limit, truncated_before=truncated))
    assert b"".join(c for _, c in chunks) == data
    assert [at for at, _ in chunks] == [sum(len(c) for _, c in chunks[:i]) for i in range(len(chunks))]
    assert all(len(c) <= limit for _, c in chunks)
    assert "".join(decode(c) for _, c in chunks) == text  # no character cut in two
    if not data:
        assert chunks == ([(0, b"")] if truncated else [])  # the empty event that says "truncated"


def test_live_split_holds_back_an_unfinished_character_until_the_end() -> None:
    euro = "€".encode()
    assert live_split(b"", b"ab" + euro[:2], final=False) == (b"ab", euro[:2])
    assert live_split(euro[:2], euro[2:], final=False) == (euro, b"")
    assert live_split(euro[:2], b"", final=True) == (euro[:2], b"")


def _waits(*, link_up: bool = True, best_effort: int = 0, lossless: int = 0, commands: tuple[str, ...] = ()) -> bool:
    return must_wait(link_up=link_up, best_effort_waiting=best_effort, lossless_pending=lossless, commands=commands)


def test_output_waits_for_the_link_and_the_lossless_path_only_while_the_link_is_up() -> None:
    assert not _waits()
    assert not _waits(best_effort=PACE_EVENTS - 1)
    assert _waits(best_effort=PACE_EVENTS)
    assert _waits(lossless=1)
    assert _waits(commands=("process.input", "session.reset"))  # its command.finished goes first
    assert not _waits(commands=("process.input",))  # a keystroke's echo never waits for its own command
    assert not _waits(link_up=False, best_effort=PACE_EVENTS, lossless=3)  # the ring keeps it for a replay


def test_a_ring_the_driver_did_not_write_is_never_read(tmp_path: Path) -> None:
    """PROTOCOL §9 (degraded containment): every block read is checked against its MAC, and so are a
    dead driver's records and rings; a forged one is skipped, never replayed or reported as an exit."""
    from driver.processes.ringfile import RingTampered
    from driver.queue.rowmac import RowMac, derive_key

    mac = RowMac(derive_key("token", "drv"))
    ring = RingFile(tmp_path, "p", 1, capacity=8192, pid=10, mac=mac)
    ring.append(b"a" * 5000)
    assert ring.read(0, 5000) == b"a" * 5000
    with ring.path.open("r+b") as f:  # the agent rewrites a byte of the first block
        f.write(b"X")
    with pytest.raises(RingTampered):
        ring.read(0, 10)
    assert ring.read(4096, 5000) == b"a" * 904  # the other block is still the driver's
    ring.append(b"b" * 100)  # the block being filled is rewritten from the driver's own copy
    assert ring.read(4096, 5100) == b"a" * 904 + b"b" * 100
    ring.close()
    # A successor: the ring's first block fails, so the process is not reported from it.
    assert leftovers(tmp_path, mac) == []
    # A record the agent planted (no MAC, or another key's) names nothing.
    forged = RingFile(tmp_path, "planted", 2, pid=11)  # written under another key
    forged.append(b"forged")
    forged.close()
    honest = RingFile(tmp_path, "honest", 3, pid=12, mac=mac)
    honest.append(b"bye")
    honest.close()
    assert [left.process_id for left in leftovers(tmp_path, mac)] == ["honest"]
