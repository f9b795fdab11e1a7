"""Structured JSON logs on stderr, every line passed through a redaction processor.

The processor replaces each registered secret (the control token, every value of
`execution.environment`, header values) wherever it appears in any string of the event dict, so a
secret cannot leak through an exception message or a provider's stderr either.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable, MutableMapping
from typing import Any

import structlog

REDACTED = "[redacted]"
_MIN_SECRET = 6  # shorter values are too likely to be ordinary words to mask safely


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


class _NamedPrintLogger(structlog.PrintLogger):
    """A PrintLogger that remembers the name it was asked for, so processors can tell loggers apart."""

    def __init__(self, file: Any, name: str) -> None:
        super().__init__(file)
        self.name = name


def _factory(stream: Any) -> Any:
    def make(*args: Any) -> _NamedPrintLogger:
        return _NamedPrintLogger(stream, str(args[0]) if args else "driver")

    return make


def configure(level: str = "info", stream: Any = None, *, uplink: bool = False) -> None:
    global UPLINK
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,
        REDACTOR,
    ]
    if uplink:
        from driver.telemetry.log_uplink import LogUplink

        UPLINK = LogUplink()
        processors.append(UPLINK)  # after the redactor: only redacted lines are ever copied
    processors.append(structlog.processors.JSONRenderer())
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO), stream=stream or sys.stderr, format="%(message)s"
    )
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper(), logging.INFO)),
        logger_factory=_factory(stream or sys.stderr),
        cache_logger_on_first_use=True,
    )


def get(name: str) -> Any:
    return structlog.get_logger(name)
