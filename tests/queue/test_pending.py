"""The outbox's compact pending index (driver/queue/pending.py): seq lookup, states, the ready cursor,
removal and compaction, checked by hand and against a plain dict model."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from driver.queue.pending import GONE, IN_FLIGHT, READY, UNSYNCED, WAITING, PendingIndex


def filled(n: int, state: int = READY, compact_min: int = 4096) -> PendingIndex:
    index = PendingIndex()
    index.compact_min = compact_min
    for k in range(n):
        index.add(10 + 2 * k, 100 + k, state, k)  # even seqs: best-effort events take the odd ones
    return index


def ready_seqs(index: PendingIndex) -> list[int]:
    out, i = [], index.next_ready()
    while i >= 0:
        out.append(index.seqs[i])
        i = index.next_ready(i + 1)
    return out


def test_seqs_are_found_by_bisection_and_only_while_live() -> None:
    index = filled(5)
    assert [index.find(s) for s in (10, 12, 18)] == [0, 1, 4]
    assert index.find(11) == -1 and index.find(9) == -1 and index.find(20) == -1
    assert index.find(14, hint=2) == 2 and index.find(14, hint=0) == 2  # a wrong hint is only a hint
    assert index.remove(2) == 102
    assert index.find(14) == -1
    assert (len(index), index.bytes) == (4, 100 + 101 + 103 + 104)


def test_seqs_must_increase() -> None:
    index = filled(2)
    for seq in (12, 11):
        try:
            index.add(seq, 1, READY, 0)
        except ValueError:
            continue
        raise AssertionError(f"seq {seq} after 12 was accepted")


def test_ready_events_come_in_seq_order_and_the_cursor_goes_back_for_a_retry() -> None:
    index = filled(4, state=UNSYNCED)
    assert index.next_ready() == -1
    index.set_ready_range(0, 3)
    assert ready_seqs(index) == [10, 12, 14]
    for i in (0, 1):
        index.states[i] = IN_FLIGHT
    assert ready_seqs(index) == [14]
    index.states[0] = WAITING
    index.set_ready(0)  # a retry released: before the cursor
    assert ready_seqs(index) == [10, 14]


def test_oldest_skips_removed_events_and_knows_unjournaled_ones() -> None:
    index = filled(3, state=UNSYNCED)
    assert index.oldest() == 0 and index.oldest_journaled() == -1
    index.set_ready_range(0, 2)
    index.remove(0)
    assert index.oldest() == 1 and index.oldest_journaled() == 1
    index.remove(1)
    assert index.oldest() == 2 and index.oldest_journaled() == -1, "only an unjournaled event is left"


def test_compaction_of_the_front_keeps_every_live_event_and_its_fields() -> None:
    index = filled(10, compact_min=4)
    for i in range(6):
        index.remove(i)
    index.states[7] = IN_FLIGHT
    index.batches[7] = 99
    index.attempts[7] = 3
    index.compact()
    assert list(index.seqs) == [22, 24, 26, 28]
    assert index.find(24) == 1 and index.batches[1] == 99 and index.attempts[1] == 3
    assert list(index.sizes) == [106, 107, 108, 109] and list(index.born) == [6, 7, 8, 9]
    assert ready_seqs(index) == [22, 26, 28]


def test_compaction_of_gaps_in_the_middle() -> None:
    index = filled(10, compact_min=4)
    for i in (1, 2, 4, 5, 7, 8):
        index.remove(i)
    index.compact()
    assert list(index.seqs) == [10, 16, 22, 28] and len(index) == 4
    assert ready_seqs(index) == [10, 16, 22, 28]
    assert index.find(16) == 1


def test_compaction_waits_until_half_is_gone_and_the_index_is_big_enough() -> None:
    index = filled(10, compact_min=4)
    for i in (1, 2, 4):
        index.remove(i)
    index.compact()
    assert len(index.seqs) == 10, "fewer than half gone: not worth a rebuild"
    small = filled(3, compact_min=4)
    small.remove(0)
    small.remove(1)
    small.compact()
    assert len(small.seqs) == 3
    for i in range(10):
        if index.states[i] != GONE:
            index.remove(i)
    index.compact()
    assert len(index.seqs) == 0 and index.oldest() == -1 and index.next_ready() == -1


@dataclass(frozen=True)
class _Op:
    what: str
    pick: int


_ops = st.lists(
    st.builds(_Op, st.sampled_from(["add", "add", "journal", "send", "wait", "ready", "remove", "compact"]),
              st.integers(0, 1000)),
    max_size=200,
)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(_ops, st.sampled_from([2, 8, 4096]))
def test_the_index_behaves_like_a_dict_of_seqs(ops: list[_Op], compact_min: int) -> None:
    index = PendingIndex()
    index.compact_min = compact_min
    model: dict[int, tuple[int, int]] = {}  # seq → (state, size)
    seq = 0
    for op in ops:
        live = sorted(model)
        target = live[op.pick % len(live)] if live else None
        if op.what == "add":
            seq += 1 + op.pick % 3
            model[seq] = (UNSYNCED, op.pick)
            index.add(seq, op.pick, UNSYNCED, 0)
        elif op.what == "compact":
            index.compact()
        elif target is not None:
            i = index.find(target)
            state, size = model[target]
            if op.what == "journal" and state == UNSYNCED:
                # Group commits journal the oldest unjournaled events first.
                first = min(s for s, (st_, _) in model.items() if st_ == UNSYNCED)
                j = index.find(first)
                index.set_ready_range(j, j + 1)
                model[first] = (READY, model[first][1])
            elif op.what == "send" and state == READY:
                index.states[i] = IN_FLIGHT
                model[target] = (IN_FLIGHT, size)
            elif op.what == "wait" and state == IN_FLIGHT:
                index.states[i] = WAITING
                model[target] = (WAITING, size)
            elif op.what == "ready" and state in (IN_FLIGHT, WAITING):
                index.set_ready(i)
                model[target] = (READY, size)
            elif op.what == "remove" and state != UNSYNCED:
                assert index.remove(i) == size
                del model[target]
        assert len(index) == len(model)
        assert index.bytes == sum(size for _, size in model.values())
        assert ready_seqs(index) == sorted(s for s, (state, _) in model.items() if state == READY)
        for s, (state, _) in model.items():
            assert index.states[index.find(s)] == state
        oldest = index.oldest()
        assert (index.seqs[oldest] if oldest >= 0 else None) == (min(model) if model else None)
