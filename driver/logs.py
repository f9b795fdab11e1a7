"""Structured JSON logs on stderr, every line passed through a redaction processor.

The processor replaces each registered secret (the control token, every value of
`execution.environment`, header values) wherever it appears in any string of the event dict, so a
secret cannot leak through an exception message or a provider's stderr either.

Why not structlog: it did this job until its import (it loads its dev console renderer, stdlib
bridge, tracebacks and more) measured ~12 ms of the driver's spawn → `hello`, a third of what the
start may cost beyond a minimal dialer (issue 10). What we use of it is small: leveled methods that
take an event name and fields, a chain of processors `(logger, method_name, event_dict) ->
event_dict` (the redactor, the log uplink), an ISO timestamp and one JSON line per record. That is
this module; the processor signature is structlog's, so a processor written for one fits the other.
"""

from __future__ import annotations

import logging
import sys
import time
import traceback
from collections.abc import Callable, Iterable, MutableMapping
from typing import Any

import msgspec

REDACTED = "[redacted]"
_MIN_SECRET = 6  # shorter values are too likely to be ordinary words to mask safely

Processor = Callable[[Any, str, MutableMapping[str, Any]], MutableMapping[str, Any]]

LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "exception": 40, "critical": 50}


class Redactor:
    def __init__(self) -> None:
        self._secrets: set[str] = set()

    def add(self, values: Iterable[str | None]) -> None:
        for v in values:
            if v and len(v) >= _MIN_SECRET:
                self._secrets.add(v)

    def redact(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        return text

    def _walk(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, dict):
            return {k: self._walk(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self._walk(v) for v in value]
        return value

    def __call__(self, logger: Any, name: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        if not self._secrets:
            return event_dict
        return {k: self._walk(v) for k, v in event_dict.items()}


REDACTOR = Redactor()
# The copy of every (redacted) line for the control plane (driver.telemetry.log_uplink), installed by
# `configure(uplink=True)`: `agent-driver run` only.
UPLINK: Any = None


class _Config:
    """What `configure` set; read by every logger at each call, so loggers made at import time (before
    `configure`) follow it."""

    level = LEVELS["info"]
    stream: Any = None  # None: sys.stderr as it is at the time of the call (tests swap it)
    processors: list[Processor] = [REDACTOR]


def _timestamp() -> str:
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1_000_000):06d}Z"


def _render(event_dict: MutableMapping[str, Any]) -> str:
    try:
        return msgspec.json.encode(event_dict, enc_hook=repr).decode()
    except (TypeError, ValueError, OverflowError):
        # Keys that are not strings, integers beyond 64 bits...: never lose the line for its fields.
        return msgspec.json.encode({str(k): repr(v) for k, v in event_dict.items()}).decode()


class Logger:
    """`log.info("event.name", field=value)`: one JSON line, or nothing below the configured level."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def _log(self, method: str, event: str, fields: dict[str, Any]) -> None:
        if LEVELS[method] < _Config.level:
            return
        with_traceback = fields.pop("exc_info", method == "exception")
        event_dict: MutableMapping[str, Any] = {"event": event, **fields}
        event_dict["level"] = "error" if method == "exception" else method
        event_dict["timestamp"] = _timestamp()
        if with_traceback and sys.exc_info()[0] is not None:
            event_dict["exception"] = traceback.format_exc().rstrip()
        for processor in _Config.processors:
            event_dict = processor(self, method, event_dict)
        stream = _Config.stream or sys.stderr
        try:
            stream.write(_render(event_dict) + "\n")
            stream.flush()
        except (OSError, ValueError):
            pass  # stderr closed or gone: a log line is never worth crashing the driver

    def debug(self, event: str, **fields: Any) -> None:
        self._log("debug", event, fields)

    def info(self, event: str, **fields: Any) -> None:
        self._log("info", event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._log("warning", event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._log("error", event, fields)

    def critical(self, event: str, **fields: Any) -> None:
        self._log("critical", event, fields)

    def exception(self, event: str, **fields: Any) -> None:
        """`error` with the traceback of the exception being handled."""
        self._log("exception", event, fields)


def configure(level: str = "info", stream: Any = None, *, uplink: bool = False) -> None:
    global UPLINK
    processors: list[Processor] = [REDACTOR]
    if uplink:
        from driver.telemetry.log_uplink import LogUplink

        UPLINK = LogUplink()
        processors.append(UPLINK)  # after the redactor: only redacted lines are ever copied
    numeric = LEVELS.get(level.lower(), LEVELS["info"])
    _Config.level = numeric
    _Config.stream = stream
    _Config.processors = processors
    # Libraries (websockets, mcp, the OpenTelemetry SDK) log through the standard library.
    logging.basicConfig(level=numeric, stream=stream or sys.stderr, format="%(message)s")


def get(name: str) -> Logger:
    return Logger(name)
