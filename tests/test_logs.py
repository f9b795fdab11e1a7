"""The driver's logger: one JSON line per record, levels, redaction, tracebacks, odd fields."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from driver import logs


@pytest.fixture
def out() -> Any:
    stream = io.StringIO()
    logs.configure("info", stream=stream)
    yield stream
    logs.REDACTOR.clear()
    logs.configure("info")


def lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_one_json_line_per_record_with_level_timestamp_and_fields(out: io.StringIO) -> None:
    logs.get("driver.test").info("thing.happened", n=3, path="/x")
    (record,) = lines(out)
    assert record["event"] == "thing.happened" and record["level"] == "info"
    assert record["n"] == 3 and record["path"] == "/x"
    assert record["timestamp"].endswith("Z") and record["timestamp"][10] == "T"


def test_records_below_the_level_are_not_written(out: io.StringIO) -> None:
    log = logs.get("driver.test")
    log.debug("quiet")
    log.warning("loud")
    assert [r["event"] for r in lines(out)] == ["loud"]
    logs.configure("debug", stream=out)
    log.debug("now heard")
    assert lines(out)[-1]["event"] == "now heard"


def test_secrets_are_redacted_in_every_string_field(out: io.StringIO) -> None:
    logs.REDACTOR.add(["s3cr3t-token-value"])
    logs.get("driver.test").error("leak", detail="x s3cr3t-token-value y", nested={"a": ["s3cr3t-token-value"]})
    text = out.getvalue()
    assert "s3cr3t" not in text
    (record,) = lines(out)
    assert record["detail"] == "x [redacted] y" and record["nested"] == {"a": ["[redacted]"]}


def test_exception_carries_the_traceback_and_is_an_error(out: io.StringIO) -> None:
    try:
        raise RuntimeError("boom s3cr3t-token-value")
    except RuntimeError:
        logs.REDACTOR.add(["s3cr3t-token-value"])
        logs.get("driver.test").exception("failed")
    (record,) = lines(out)
    assert record["level"] == "error"
    assert "RuntimeError: boom [redacted]" in record["exception"] and "Traceback" in record["exception"]


def test_fields_json_cannot_encode_still_give_a_line(out: io.StringIO) -> None:
    log = logs.get("driver.test")
    log.info("odd", thing=object(), big=2**70, raw=b"\xff")
    log.info("keys", mapping={1: "a", (2, 3): "b"})
    first, second = lines(out)
    assert first["event"] == "odd" and "object" in first["thing"]
    assert second["event"] == "keys"


def test_loggers_made_before_configure_follow_it() -> None:
    early = logs.get("driver.early")
    stream = io.StringIO()
    try:
        logs.configure("error", stream=stream)
        early.warning("dropped")
        early.error("kept")
    finally:
        logs.configure("info")
    assert [json.loads(line)["event"] for line in stream.getvalue().splitlines()] == ["kept"]


def test_standard_library_records_at_any_level_pass_the_same_redactor(out: io.StringIO) -> None:
    import logging

    logs.configure("debug", stream=out)
    logs.add(["s3cr3t-token-value"])
    logging.getLogger("websockets.client").debug("> Authorization: Bearer %s", "s3cr3t-token-value")
    logging.getLogger("some.lib").warning("odd %s", b"raw s3cr3t-token-value")
    assert "s3cr3t" not in out.getvalue()
    first, second = lines(out)
    assert first == {**first, "event": "> Authorization: Bearer [redacted]", "level": "debug"}
    assert first["logger"] == "websockets.client" and "timestamp" in first
    assert second["level"] == "warning" and "[redacted]" in second["event"]


def test_standard_library_records_below_the_level_are_dropped(out: io.StringIO) -> None:
    import logging

    logging.getLogger("websockets.client").debug("quiet")
    logging.getLogger("websockets.client").info("heard")
    assert [r["event"] for r in lines(out)] == ["heard"]


def test_bytes_and_objects_are_redacted_before_they_are_encoded(out: io.StringIO) -> None:
    class Holder:
        def __repr__(self) -> str:
            return "Holder(s3cr3t-token-value)"

    logs.add(["s3cr3t-token-value"])
    logs.get("driver.test").info("head", raw=b'{"jsonrpc":"2.0","key":"s3cr3t-token-value"}\xff', obj=Holder())
    assert "s3cr3t" not in out.getvalue()
    (record,) = lines(out)
    assert record["raw"] == '{"jsonrpc":"2.0","key":"[redacted]"}\\xff'
    assert record["obj"] == "Holder([redacted])"


def test_a_secret_containing_another_is_replaced_whole(out: io.StringIO) -> None:
    logs.add(["abcdef", "abcdef-longer-secret", None, "short"])
    assert logs.redact("x abcdef-longer-secret y abcdef short") == "x [redacted] y [redacted] short"


def test_a_text_cut_inside_a_secret_does_not_keep_its_first_part(out: io.StringIO) -> None:
    logs.add(["cp-token-SECRET-4242"])
    assert logs.redact("error: bad header Bearer cp-token-SEC") == "error: bad header Bearer [redacted]"
    assert logs.redact("ends in cp-tok") == "ends in [redacted]"
    assert logs.redact("ends in cp-to") == "ends in cp-to"  # shorter than 6 characters: an ordinary word
    assert logs.redact("token") == "token"
