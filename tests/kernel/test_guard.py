"""The supervision boundary's parts (driver.kernel.guard): a task's unexpected error is reported as a
lossless diagnostic (type, redacted message) and ends only that task; a long-lived task is restarted."""

from __future__ import annotations

import os
from typing import Any, cast

import anyio
import pytest

from driver import guard, logs

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class FakeKernel:
    def __init__(self, *, broken_emit: bool = False) -> None:
        self.emitted: list[tuple[str, dict[str, Any]]] = []
        self.broken_emit = broken_emit

    async def emit(self, kind: str, payload: dict[str, Any]) -> str:
        if self.broken_emit:
            raise RuntimeError("the events port is down")
        self.emitted.append((kind, payload))
        return "evt"


def kernel(fake: FakeKernel) -> Any:
    return cast(Any, fake)


def test_describe_redacts_escapes_and_cuts() -> None:
    logs.REDACTOR.add(["sk-guard-secret-123456"])
    name, text = guard.describe(ValueError("token sk-guard-secret-123456 in " + os.fsdecode(b"f\xff") + "x" * 999))
    assert name == "ValueError"
    assert "sk-guard-secret-123456" not in text
    assert "f\\xff" in text
    assert len(text) <= guard.MESSAGE_LIMIT
    text.encode("utf-8")  # encodes: no lone surrogate
    group = ExceptionGroup("g", [KeyError("k")])
    assert guard.describe(group)[0] == "KeyError"


async def test_a_failing_task_is_reported_and_ends_alone() -> None:
    fake = FakeKernel()

    async def boom(x: int) -> None:
        raise ZeroDivisionError(f"x={x}")

    async with anyio.create_task_group() as tg:
        tg.start_soon(guard.supervised, kernel(fake), boom, 3)
    [(kind, payload)] = fake.emitted
    assert kind == "diagnostic.reported"
    assert payload["code"] == "driver.internal_error" and payload["severity"] == "error"
    assert payload["details"]["exception_type"] == "ZeroDivisionError"
    assert "x=3" in payload["message"]


async def test_a_broken_events_port_does_not_raise_from_report() -> None:
    await guard.report(kernel(FakeKernel(broken_emit=True)), "unit", RuntimeError("x"))


async def test_a_long_lived_task_is_restarted_with_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(guard, "RESTART_BASE_S", 0.001)
    fake = FakeKernel()
    calls = 0

    async def flaky() -> None:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise OSError(f"failure {calls}")

    with anyio.fail_after(5):
        await guard.keep(kernel(fake), "flaky", flaky)
    assert calls == 3
    assert [p["details"]["unit"] for _, p in fake.emitted] == ["task flaky", "task flaky"]
    assert fake.emitted[1][1]["details"]["restarting_in_s"] == 0.002


async def test_cancellation_is_not_an_error() -> None:
    fake = FakeKernel()

    async def forever() -> None:
        await anyio.sleep_forever()

    with anyio.move_on_after(0.05):
        await guard.keep(kernel(fake), "forever", forever)
    assert fake.emitted == []
