"""The log uplink processor without I/O: the held buffer and its drop count, the per-logger rate
limits, the mirror of warnings and errors, redaction before copying, and the recursion guard."""

from __future__ import annotations

import io
import json
from typing import Any

from driver import logs
from driver.telemetry.log_uplink import LINE_BURST, MIRROR_BURST, LogUplink, diagnostic_of, not_copied


class Clock:
    def __init__(self) -> None:
        self.t = 1_700_000_000.0

    def __call__(self) -> float:
        return self.t


def line(uplink: LogUplink, name: str, level: str = "info", **fields: Any) -> None:
    uplink(
        logs.Logger(name), level, {"event": "something.happened", "level": level, **fields}
    )


def test_held_lines_are_bounded_keeping_the_newest_and_counting_drops() -> None:
    clock = Clock()
    uplink = LogUplink(max_held=10, clock=clock)
    for i in range(25):
        clock.t += 1  # slow enough for the rate limit
        line(uplink, "driver.link", n=i)
    assert len(uplink) == 10
    batch, dropped = uplink.take_batch(100)
    assert dropped == 15 and [r["fields"]["n"] for r in batch] == list(range(15, 25))
    assert batch[0]["logger"] == "driver.link" and batch[0]["level"] == "info"
    assert batch[0]["at"].endswith("Z") and batch[0]["message"] == "something.happened"
    assert uplink.take_batch(100) == ([], 0)  # the count travels once


def test_rate_limit_is_per_logger() -> None:
    clock = Clock()
    uplink = LogUplink(clock=clock)
    for _ in range(int(LINE_BURST) + 50):
        line(uplink, "noisy")
    line(uplink, "quiet")
    batch, dropped = uplink.take_batch(1000)
    assert dropped == 50
    assert sum(r["logger"] == "noisy" for r in batch) == LINE_BURST
    assert [r for r in batch if r["logger"] == "quiet"]  # another logger is not starved
    clock.t += 1.0  # the bucket refills (20 lines a second)
    for _ in range(30):
        line(uplink, "noisy")
    assert uplink.take_batch(1000)[1] == 10


def test_warnings_and_errors_are_mirrored_within_their_own_bound() -> None:
    clock = Clock()
    uplink = LogUplink(clock=clock)
    line(uplink, "driver.kernel", "info")
    line(uplink, "driver.kernel", "warning", code=7)
    line(uplink, "driver.kernel", "error")
    mirrored = uplink.take_mirrored()
    assert [r["level"] for r in mirrored] == ["warning", "error"]
    diagnostic = diagnostic_of(mirrored[0])
    assert diagnostic["code"] == "driver.log" and diagnostic["severity"] == "warning"
    assert diagnostic["message"] == "driver.kernel: something.happened"
    assert diagnostic["details"]["fields"] == {"code": 7}
    for _ in range(int(MIRROR_BURST) + 5):
        line(uplink, "driver.kernel", "error")
    assert len(uplink.take_mirrored()) == MIRROR_BURST - 2 and uplink.mirror_dropped == 7


def test_batches_are_bounded_in_bytes() -> None:
    clock = Clock()
    uplink = LogUplink(clock=clock)
    for _ in range(50):
        clock.t += 1
        line(uplink, "driver.kernel", detail="x" * 3000)
    batch, _ = uplink.take_batch(100, max_bytes=16 * 1024)
    assert 1 < len(batch) < 50 and len(json.dumps(batch)) <= 16 * 1024
    assert len(uplink) == 50 - len(batch)


def test_recursion_guard_and_odd_values() -> None:
    uplink = LogUplink(clock=Clock())
    with not_copied():
        line(uplink, "driver.telemetry")
    assert len(uplink) == 0
    line(uplink, "x", path=object(), big="y" * 10_000)
    (record,), _ = uplink.take_batch(10)
    assert json.dumps(record)  # plain JSON whatever the fields held
    assert len(json.dumps(record["fields"])) < 5000


def test_configured_uplink_sees_only_redacted_lines() -> None:
    out = io.StringIO()
    try:
        logs.configure("info", stream=out, uplink=True)
        logs.REDACTOR.add(["supersecret-value-123"])
        logs.get("driver.test").warning("leak.attempt", detail="token supersecret-value-123 here")
        uplink = logs.UPLINK
        assert uplink is not None
        (record,), _ = uplink.take_batch(10)
        assert record["logger"] == "driver.test" and record["fields"]["detail"] == "token [redacted] here"
        assert "supersecret" not in out.getvalue()
    finally:
        logs.UPLINK = None
        logs.configure("info")
