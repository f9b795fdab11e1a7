"""The ledger's snapshot (journaled by the kernel, PROTOCOL §8.2): read back whole, or not at all."""

from __future__ import annotations

from typing import Any

import pytest

from driver.model_proxy.budget import Ledger, Ticket
from driver.protocol.boot import Budget


def spent_ledger() -> Ledger:
    ledger = Ledger(Budget(max_usd_per_session=1.0))
    for run_id in ("run-1", "run-2"):
        ticket = ledger.admit(run_id, 10, 0.01)
        assert isinstance(ticket, Ticket)
        ledger.settle(ticket, 100, 20, 5, 0.25)
    ledger.close_run("run-1")
    return ledger


def test_a_snapshot_restores_the_session_and_the_open_runs() -> None:
    snapshot = spent_ledger().snapshot()
    fresh = Ledger(Budget(max_usd_per_session=1.0))
    assert fresh.restore(snapshot)
    assert (fresh.session.requests, fresh.session.cost_usd, fresh.session.input_tokens) == (2, 0.5, 200)
    assert set(fresh.runs) == {"run-2"}  # a closed run's usage was fixed at its terminal
    assert fresh.run("run-2").output_tokens == 20


@pytest.mark.parametrize(
    "bad",
    [None, [], {"session": None}, {"session": {"requests": -1}}, {"session": {}, "runs": []}],
)
def test_a_snapshot_that_is_not_one_is_not_taken(bad: Any) -> None:
    ledger = Ledger(Budget(max_usd_per_session=1.0))
    assert not ledger.restore(bad)
    assert ledger.session.requests == 0
    good = spent_ledger().snapshot()
    good["session"]["cost_usd"] = True
    assert not ledger.restore(good)
