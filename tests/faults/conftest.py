"""Fixtures of the fault suite: real driver processes running the flood agent, closed after each test."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_lab.testing import agents

from tests.integration.harness import DriverProcess, boot_payload

FLOOD = agents.FLOOD


class Drivers:
    """Starts driver processes for one test (same instance id and state_dir) and kills what is left."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.started: list[DriverProcess] = []

    def start(self, url: str, *, outbox_max_events: int | None = None) -> DriverProcess:
        name = f"driver{len(self.started) + 1}"
        env = {} if outbox_max_events is None else {"AGENT_DRIVER_OUTBOX_MAX_EVENTS": str(outbox_max_events)}
        payload = boot_payload(self.tmp, url, acp_command=[sys.executable, str(FLOOD)])
        d = DriverProcess(self.tmp, payload, name, extra_env=env)
        self.started.append(d)
        return d

    def close(self) -> None:
        for d in self.started:
            d.close()


@pytest.fixture
def drivers(tmp_path: Path) -> Iterator[Drivers]:
    ds = Drivers(tmp_path)
    try:
        yield ds
    finally:
        ds.close()
