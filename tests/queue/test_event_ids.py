"""Event ids derived from (instance, epoch, seq) (driver/queue/event_ids.py, PROTOCOL §4)."""

from __future__ import annotations

import pytest

from driver.protocol.events import event_id_for
from driver.queue.event_ids import EventIds

INSTANCE = "drv-ids"


def test_ids_follow_the_epoch_that_admitted_each_seq() -> None:
    ids = EventIds(INSTANCE)
    ids.recover(3, event_id_for(INSTANCE, 1, 3))
    ids.recover(9, event_id_for(INSTANCE, 1, 9))
    ids.recover(70_000, event_id_for(INSTANCE, 2, 70_000))
    ids.add(140_000, 3)
    assert ids.of(3) == "drv-ids/1/000003" and ids.of(9) == "drv-ids/1/000009"
    assert ids.of(70_000) == "drv-ids/2/070000"
    assert ids.of(140_001) == "drv-ids/3/140001"
    assert ids.of(1_234_567) == "drv-ids/3/1234567", "seqs wider than six digits are not cut"


def test_an_id_not_of_the_derived_form_is_kept_verbatim() -> None:
    ids = EventIds(INSTANCE)
    odd = ["other-instance/1/000004", "drv-ids/1/4", "drv-ids/x/000006"]
    ids.recover(2, event_id_for(INSTANCE, 1, 2))
    for seq, event_id in zip((4, 5, 6), odd, strict=True):
        ids.recover(seq, event_id)
    ids.recover(7, event_id_for(INSTANCE, 1, 7))
    assert [ids.of(s) for s in (2, 4, 5, 6, 7)] == [
        "drv-ids/1/000002",
        "other-instance/1/000004",
        "drv-ids/1/4",
        "drv-ids/x/000006",
        "drv-ids/1/000007",
    ]
    ids.forget(4)
    assert ids.of(4) == "drv-ids/1/000004", "forgotten: derived again like any other"


def test_epochs_may_go_back_between_steps() -> None:
    ids = EventIds(INSTANCE)
    ids.recover(1, event_id_for(INSTANCE, 5, 1))
    ids.recover(2, event_id_for(INSTANCE, 4, 2))
    assert [ids.of(1), ids.of(2)] == ["drv-ids/5/000001", "drv-ids/4/000002"]


def test_a_seq_before_any_step_has_no_id() -> None:
    ids = EventIds(INSTANCE)
    ids.add(10, 1)
    with pytest.raises(KeyError):
        ids.of(9)


@pytest.mark.parametrize(
    ("event_id", "seq"),
    [("drv/1/000042", 42), ("drv/1/42", 42), ("42", 42), ("drv/1/", None), ("drv/1/4x", None), ("drv/1/²", None)],
)
def test_the_seq_an_id_names(event_id: str, seq: int | None) -> None:
    assert EventIds.seq_of(event_id) == seq
