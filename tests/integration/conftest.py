"""Fixtures of the integration tests: the anyio backend and the driver processes a test started."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.harness import DriverProcess


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def drivers() -> Iterator[list[DriverProcess]]:
    """Driver processes a test started; each is killed (and its log closed) after the test."""
    started: list[DriverProcess] = []
    yield started
    for d in started:
        d.close()
