"""Fixtures of the kernel tests."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from tests.kernel.runtimes import Fakes
from tests.kernel.support import Driver, children


@pytest.fixture
def drivers() -> Iterator[list[Driver]]:
    started: list[Driver] = []
    yield started
    for d in started:
        pids = children(d.pid)
        d.close()
        for pid in pids:  # a provider a failed test left behind must not outlive it
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def fakes() -> Iterator[Fakes]:
    """The fake model endpoints the real-runtime tests point their providers at (one per module)."""
    with ExitStack() as stack:
        yield Fakes(stack)
