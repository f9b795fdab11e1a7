"""Structured JSON logs on stderr through structlog, every record passed through one redactor.

structlog is configured lean: a filtering bound logger (a level below the configured one costs a
method call that returns), the level and an ISO timestamp, the exception's traceback when asked,
then the redactor, then (for `agent-driver run`) the log uplink, then one JSON line rendered with
msgspec. No dev console renderer, no stdlib `ProcessorFormatter`: a small handler forwards the
standard library's records (websockets, mcp, the OpenTelemetry SDK) into the same chain, so a
third-party line at any level passes the same redactor as ours (websockets logs request headers,
`Authorization` included, at debug).

One redactor, one rule: `REDACTOR` holds every secret the driver knows (the control token, every
value of `execution.environment`, MCP header values, the host MCP server's token, provider
placeholders: `add()`), and replaces each wherever it appears in any string of a record, in dict
keys, in `bytes` (decoded before anything encodes them) and in the `repr` of any other object. The
provider stderr tail (driver/adapters/common/process.py) and the Claude adapter's messages use the same
`redact()`.
"""

from __future__ import annotations

import logging
import sys
import traceback
from collections.abc import Callable, Iterable, MutableMapping
from typing import Any

import msgspec
import structlog

REDACTED = "[redacted]"
_MIN_SECRET = 6  # shorter values are too likely to be ordinary words to mask safely

Processor = Callable[[Any, str, MutableMapping[str, Any]], Any]

LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "exception": 40, "critical": 50}
_PLAIN = (int, float, bool, type(None))


class Redactor:
    """A structlog processor that masks every registered secret; `redact()` for plain text."""

    def __init__(self) -> None:
        self._secrets: set[str] = set()
        self._ordered: list[str] = []

    def add(self, values: Iterable[str | None]) -> None:
        for v in values:
            if v and len(v) >= _MIN_SECRET:
                self._secrets.add(v)
        # Longest first: a secret that contains another is replaced whole.
        self._ordered = sorted(self._secrets, key=len, reverse=True)

    def clear(self) -> None:
        self._secrets.clear()
        self._ordered = []

    def redact(self, text: str) -> str:
        for secret in self._ordered:
            if secret in text:
                text = text.replace(secret, REDACTED)
        if len(text) >= _MIN_SECRET:
            # A text cut short (`str(exc)[:200]`) may end in the first part of a secret: mask that too.
            tail = text[-_MIN_SECRET:]
            for secret in self._ordered:
                if tail in secret:
                    for k in range(len(secret) - 1, _MIN_SECRET - 1, -1):
                        if text.endswith(secret[:k]):
                            text = text[:-k] + REDACTED
                            break
        return text

    def _walk(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, _PLAIN):
            return value
        if isinstance(value, bytes | bytearray | memoryview):
            # Before any encoder sees them: JSON would base64 them, hiding a secret from `redact`.
            return self.redact(bytes(value).decode("utf-8", "backslashreplace"))
        if isinstance(value, dict):
            return {self._walk(k) if isinstance(k, str) else k: self._walk(v) for k, v in value.items()}
        if isinstance(value, list | tuple | set | frozenset):
            return [self._walk(v) for v in value]
        # Anything else is rendered by its repr: make it here, so it is redacted too.
        try:
            return self.redact(repr(value))
        except Exception:
            return f"<unrepresentable {type(value).__name__}>"

    def __call__(self, logger: Any, name: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        return {k: self._walk(v) for k, v in event_dict.items()}


REDACTOR = Redactor()


def add(values: Iterable[str | None]) -> None:
    """Register more secrets with the one redactor (values shorter than 6 characters are ignored)."""
    REDACTOR.add(values)


def redact(text: str) -> str:
    return REDACTOR.redact(text)


# The copy of every (redacted) line for the control plane (driver.telemetry.log_uplink), installed by
# `configure(uplink=True)`: `agent-driver run` only.
UPLINK: Any = None


class _Stream:
    """Where lines go; None: sys.stderr as it is at the time of the call (tests swap it)."""

    target: Any = None


class Logger:
    """structlog's logger at the end of the chain: writes the rendered line. `name` is the logger's
    name (the uplink groups its rate limits by it)."""

    __slots__ = ("name",)

    def __init__(self, name: str = "driver", *_: Any) -> None:
        self.name = name

    def msg(self, line: str) -> None:
        stream = _Stream.target or sys.stderr
        try:
            stream.write(line + "\n")
            stream.flush()
        except (OSError, ValueError):
            pass  # stderr closed or gone: a log line is never worth crashing the driver

    debug = info = warning = error = critical = fatal = log = msg


def _add_level(logger: Any, method: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    event_dict.setdefault("level", "warning" if method == "warn" else method)
    return event_dict


def _exc_info(logger: Any, method: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """`exc_info=True` (and `.exception()`): the traceback of the exception being handled, if any."""
    wanted = event_dict.pop("exc_info", False)
    if wanted and "exception" not in event_dict and sys.exc_info()[0] is not None:
        event_dict["exception"] = traceback.format_exc().rstrip()
    return event_dict


def _render(logger: Any, method: str, event_dict: MutableMapping[str, Any]) -> str:
    try:
        return msgspec.json.encode(event_dict, enc_hook=repr).decode()
    except (TypeError, ValueError, OverflowError):
        # Keys that are not strings, integers beyond 64 bits...: never lose the line for its fields.
        return msgspec.json.encode({str(k): repr(v) for k, v in event_dict.items()}).decode()


_TIMESTAMP = structlog.processors.TimeStamper(fmt="iso", utc=True, key="timestamp")


def _processors(uplink: Any) -> list[Processor]:
    chain: list[Processor] = [_add_level, _TIMESTAMP, _exc_info, REDACTOR]
    if uplink is not None:
        chain.append(uplink)  # after the redactor: only redacted lines are ever copied
    chain.append(_render)
    return chain


class _Forward(logging.Handler):
    """The standard library's records into the same chain (same redactor, same uplink, same line)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            fields: dict[str, Any] = {"logger": record.name}
            if record.exc_info and record.exc_info[0] is not None:
                fields["exception"] = "".join(traceback.format_exception(*record.exc_info)).rstrip()
            level = logging.getLevelName(record.levelno).lower()
            method = level if level in LEVELS else "info"
            getattr(get(record.name), method)(record.getMessage(), **fields)
        except Exception:  # a library's odd record (bad format arguments) must not raise into it
            self.handleError(record)


_FORWARD = _Forward()


def configure(level: str = "info", stream: Any = None, *, uplink: bool = False) -> None:
    global UPLINK
    up = None
    if uplink:
        from driver.telemetry.log_uplink import LogUplink

        up = UPLINK = LogUplink()
    numeric = LEVELS.get(level.lower(), LEVELS["info"])
    _Stream.target = stream
    structlog.configure(
        processors=_processors(up),
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=Logger,
        cache_logger_on_first_use=False,
    )
    _Generation.n += 1  # loggers made before (at import time) follow this configuration
    # Libraries log through the standard library: every record of theirs, at any level, is forwarded.
    root = logging.getLogger()
    for handler in list(root.handlers):
        # A plain stream handler (`logging.basicConfig`'s) would write records past the redactor.
        if type(handler) is logging.StreamHandler:
            root.removeHandler(handler)
    if _FORWARD not in root.handlers:
        root.addHandler(_FORWARD)
    root.setLevel(numeric)


class _Generation:
    """Bumped by `configure`: a `BoundLog` rebuilds its structlog logger when it changed."""

    n = 0


class BoundLog:
    """`log.info("event.name", field=value)`: one JSON line, or nothing below the configured level.

    Holds a concrete structlog bound logger for its name, rebuilt after each `configure`, so a logger
    made at import time follows a later `configure`, and a call below the level costs one method call
    (structlog's lazy proxy would rebuild the logger at every call: 10 µs for a dropped debug line
    where this is ~1 µs, measured)."""

    __slots__ = ("_bound", "_generation", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self._bound: Any = None
        self._generation = -1

    def _logger(self) -> Any:
        if self._generation != _Generation.n:
            self._bound = structlog.get_logger(self.name).bind()
            self._generation = _Generation.n
        return self._bound

    def debug(self, event: str, **fields: Any) -> None:
        self._logger().debug(event, **fields)

    def info(self, event: str, **fields: Any) -> None:
        self._logger().info(event, **fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._logger().warning(event, **fields)

    def error(self, event: str, **fields: Any) -> None:
        self._logger().error(event, **fields)

    def critical(self, event: str, **fields: Any) -> None:
        self._logger().critical(event, **fields)

    def exception(self, event: str, **fields: Any) -> None:
        """`error` with the traceback of the exception being handled."""
        self._logger().exception(event, **fields)


def get(name: str) -> BoundLog:
    return BoundLog(name)


# Until `configure` runs (imports, tests that never call it): the same chain at info, to stderr.
structlog.configure(
    processors=_processors(None),
    wrapper_class=structlog.make_filtering_bound_logger(LEVELS["info"]),
    logger_factory=Logger,
    cache_logger_on_first_use=False,
)
