"""The driver's state table (driver/kernel/states.py): allowed and refused transitions."""

from __future__ import annotations

from typing import get_args

import pytest

from driver.kernel.states import TRANSITIONS, InvalidTransition, State, StateMachine, Trigger
from driver.protocol.frames import DriverStateName

STATES: tuple[State, ...] = get_args(State)
TRIGGERS: tuple[Trigger, ...] = get_args(Trigger)


def machine(state: State) -> StateMachine:
    return StateMachine(state)


@pytest.mark.parametrize(
    ("state", "trigger", "after"),
    [
        ("starting", "provider_ready", "ready"),
        ("ready", "run_started", "running"),
        ("starting", "run_started", "running"),
        ("running", "permission_pending", "waiting_permission"),
        ("waiting_permission", "permission_settled", "running"),
        ("running", "run_ended", "ready"),
        ("waiting_permission", "run_ended", "ready"),
        ("ready", "provider_lost", "starting"),
        ("running", "provider_lost", "running"),
        ("ready", "stop", "stopping"),
        ("running", "stop", "stopping"),
        ("waiting_permission", "stop", "stopping"),
        ("starting", "stop", "stopping"),
        ("stopping", "run_ended", "stopping"),
        ("stopping", "stopped", "stopped"),
    ],
)
def test_allowed(state: State, trigger: Trigger, after: State) -> None:
    m = machine(state)
    assert m.can(trigger)
    assert m.fire(trigger) == after
    assert m.state == after


@pytest.mark.parametrize(
    ("state", "trigger"),
    [
        ("running", "run_started"),  # one run at a time
        ("waiting_permission", "run_started"),
        ("ready", "run_ended"),  # no run to end
        ("starting", "run_ended"),
        ("ready", "permission_pending"),  # permissions only inside a run
        ("starting", "permission_pending"),
        ("stopping", "run_started"),  # no new work once stopping
        ("ready", "stopped"),  # only a stopping driver becomes stopped
        ("running", "stopped"),
        ("starting", "stopped"),
    ],
)
def test_refused(state: State, trigger: Trigger) -> None:
    m = machine(state)
    assert not m.can(trigger)
    with pytest.raises(InvalidTransition, match=trigger):
        m.fire(trigger)
    assert m.state == state, "a refused trigger must leave the state unchanged"


def test_stopped_is_final() -> None:
    for trigger in TRIGGERS:
        assert not machine("stopped").can(trigger)


def test_stop_is_reachable_from_every_live_state_and_never_undone() -> None:
    for state in STATES:
        if state != "stopped":
            assert TRANSITIONS.get((state, "stop")) == "stopping"
    for (state, _trigger), after in TRANSITIONS.items():
        if state == "stopping":
            assert after in ("stopping", "stopped")


def test_table_only_names_known_states_and_triggers() -> None:
    for (state, trigger), after in TRANSITIONS.items():
        assert state in STATES and after in STATES and trigger in TRIGGERS


def test_every_reported_state_is_a_heartbeat_state() -> None:
    # Heartbeats report the state (PROTOCOL §2.5); "stopped" is never reported (the process is exiting).
    assert set(STATES) - {"stopped"} == set(get_args(DriverStateName))


def test_a_whole_life() -> None:
    m = StateMachine()
    assert m.state == "starting"
    for trigger, expected in [
        ("provider_ready", "ready"),
        ("run_started", "running"),
        ("permission_pending", "waiting_permission"),
        ("permission_settled", "running"),
        ("run_ended", "ready"),
        ("stop", "stopping"),
        ("stopped", "stopped"),
    ]:
        assert m.fire(trigger) == expected  # type: ignore[arg-type]
