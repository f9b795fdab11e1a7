"""Driver states and their transitions, as a table (DESIGN: one kernel, one state machine)."""

from __future__ import annotations

from typing import Literal

State = Literal["starting", "ready", "running", "waiting_permission", "stopping", "stopped"]
Trigger = Literal[
    "provider_ready",
    "provider_lost",
    "run_started",
    "permission_pending",
    "permission_settled",
    "run_ended",
    "stop",
    "stopped",
]

TRANSITIONS: dict[tuple[State, Trigger], State] = {
    ("starting", "provider_ready"): "ready",
    ("ready", "provider_lost"): "starting",
    ("running", "provider_lost"): "running",  # the run supervisor ends the run; restart follows
    ("waiting_permission", "provider_lost"): "waiting_permission",
    ("starting", "provider_lost"): "starting",
    ("ready", "run_started"): "running",
    ("starting", "run_started"): "running",  # a run may wait for the provider inside its own task
    ("running", "permission_pending"): "waiting_permission",
    ("waiting_permission", "permission_pending"): "waiting_permission",
    ("waiting_permission", "permission_settled"): "running",
    ("running", "permission_settled"): "running",
    ("running", "run_ended"): "ready",
    ("waiting_permission", "run_ended"): "ready",
    ("running", "provider_ready"): "running",
    ("waiting_permission", "provider_ready"): "waiting_permission",
    ("starting", "stop"): "stopping",
    ("ready", "stop"): "stopping",
    ("running", "stop"): "stopping",
    ("waiting_permission", "stop"): "stopping",
    ("stopping", "stop"): "stopping",
    ("stopping", "run_ended"): "stopping",
    ("stopping", "permission_pending"): "stopping",
    ("stopping", "permission_settled"): "stopping",
    ("stopping", "provider_ready"): "stopping",
    ("stopping", "provider_lost"): "stopping",
    ("stopping", "stopped"): "stopped",
}


class InvalidTransition(RuntimeError):
    pass


class StateMachine:
    def __init__(self, state: State = "starting") -> None:
        self.state: State = state

    def fire(self, trigger: Trigger) -> State:
        try:
            self.state = TRANSITIONS[(self.state, trigger)]
        except KeyError:
            raise InvalidTransition(f"{trigger} is not allowed in state {self.state}") from None
        return self.state

    def can(self, trigger: Trigger) -> bool:
        return (self.state, trigger) in TRANSITIONS
