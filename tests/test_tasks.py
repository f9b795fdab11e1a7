"""driver.tasks: the only task groups of the driver. In a boundary a task that raises is reported and
ends alone; within a unit it fails the unit that opened the group."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from driver import tasks

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Reports:
    def __init__(self) -> None:
        self.emitted: list[tuple[str, dict[str, Any]]] = []

    async def emit(self, kind: str, payload: dict[str, Any]) -> None:
        self.emitted.append((kind, payload))


async def test_a_boundary_reports_a_failed_task_and_goes_on() -> None:
    reports = Reports()
    survivor = anyio.Event()

    async def boom() -> None:
        raise KeyError("home")

    async def other() -> None:
        await anyio.sleep(0.01)
        survivor.set()

    async with tasks.boundary("test", reports) as tg:
        assert tg.is_boundary
        tg.spawn(boom)
        tg.spawn(other)
    assert survivor.is_set()
    [(kind, payload)] = reports.emitted
    assert kind == "diagnostic.reported" and payload["code"] == "driver.internal_error"
    assert payload["details"]["exception_type"] == "KeyError" and "boom" in payload["details"]["unit"]


async def test_within_a_unit_a_failed_task_fails_the_unit() -> None:
    async def boom() -> None:
        raise ValueError("bad")

    with pytest.raises(ExceptionGroup) as failed:
        async with tasks.within("unit") as tg:
            assert not tg.is_boundary
            tg.spawn(boom)
            await anyio.sleep_forever()
    assert isinstance(failed.value.exceptions[0], ValueError)
