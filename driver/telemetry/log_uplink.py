"""The driver's own log lines, copied for the control plane (PROTOCOL §4.2 `log.records`).

`LogUplink` is a structlog processor placed after the redaction processor, so it only ever sees
redacted lines. It keeps them in a bounded buffer; the kernel's pump drains it into best-effort
`log.records` batches once the first `welcome` arrived (lines from before are held, up to
`MAX_HELD`, the oldest dropped first), and mirrors warnings and errors as lossless
`diagnostic.reported` events so they survive the sandbox.

Volume is bounded per logger by two token buckets: one for lines (`LINE_RATE`/s, bursts of
`LINE_BURST`), a tighter one for the lossless mirror (`MIRROR_BURST`, then one per `MIRROR_EVERY_S`),
because a lossless event is journaled until the control plane stores it. Every line not sent is
counted, and the count travels in the next batch's `dropped`.

Recursion: the pump marks itself with a context variable while it emits, and lines logged under
that mark (the kernel logging about the very events that carry logs) are not copied.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import time
from collections.abc import Callable, Iterator, MutableMapping
from datetime import UTC, datetime
from typing import Any

import msgspec

MAX_HELD = 1000
LINE_RATE = 20.0
LINE_BURST = 100.0
MIRROR_BURST = 20.0
MIRROR_EVERY_S = 10.0
MAX_MESSAGE_CHARS = 1000
MAX_FIELDS_BYTES = 4096
BATCH_MAX_BYTES = 64 * 1024
MIRRORED_LEVELS = frozenset({"warning", "error", "critical", "exception"})
_RESERVED = frozenset({"event", "level", "timestamp", "logger"})

_quiet: contextvars.ContextVar[bool] = contextvars.ContextVar("log_uplink_quiet", default=False)


@contextlib.contextmanager
def not_copied() -> Iterator[None]:
    """Lines logged inside are not copied (the uplink's own sending must not feed itself)."""
    token = _quiet.set(True)
    try:
        yield
    finally:
        _quiet.reset(token)


class _Bucket:
    __slots__ = ("stamp", "tokens")

    def __init__(self, tokens: float, stamp: float) -> None:
        self.tokens = tokens
        self.stamp = stamp

    def take(self, now: float, rate: float, burst: float) -> bool:
        self.tokens = min(burst, self.tokens + (now - self.stamp) * rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


def _at(now: float) -> str:
    return datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{int(now % 1 * 1000):03d}Z"


def _fields(event_dict: MutableMapping[str, Any]) -> dict[str, Any]:
    fields = {k: v for k, v in event_dict.items() if k not in _RESERVED}
    if not fields:
        return {}
    try:
        encoded = msgspec.json.encode(fields, enc_hook=str)
    except (TypeError, ValueError):
        return {"unencodable": True}
    if len(encoded) > MAX_FIELDS_BYTES:
        return {"truncated": encoded[:MAX_FIELDS_BYTES].decode(errors="ignore")}
    plain: dict[str, Any] = msgspec.json.decode(encoded)
    return plain


class LogUplink:
    """The processor. It may run in any thread (a worker thread logging): it only appends to deques,
    and the pump polls them, so no event-loop object is touched here."""

    def __init__(self, *, max_held: int = MAX_HELD, clock: Callable[[], float] = time.time) -> None:
        self.max_held = max_held
        self._clock = clock
        self._records: collections.deque[dict[str, Any]] = collections.deque()
        self._mirror: collections.deque[dict[str, Any]] = collections.deque()
        self._lines: dict[str, _Bucket] = {}
        self._mirrors: dict[str, _Bucket] = {}
        self.dropped = 0  # lines not copied since the last batch (buffer full or rate-limited)
        self.dropped_total = 0
        self.mirror_dropped = 0

    # -- the structlog processor ---------------------------------------------------------------------
    def __call__(self, logger: Any, method_name: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        if _quiet.get():
            return event_dict
        now = self._clock()
        name = str(event_dict.get("logger") or getattr(logger, "name", None) or "driver")
        level = str(event_dict.get("level") or method_name)
        bucket = self._lines.get(name)
        if bucket is None:
            bucket = self._lines[name] = _Bucket(LINE_BURST, now)
        if not bucket.take(now, LINE_RATE, LINE_BURST):
            self._drop()
            return event_dict
        record = {
            "at": _at(now),
            "level": level,
            "logger": name,
            "message": str(event_dict.get("event", ""))[:MAX_MESSAGE_CHARS],
            "fields": _fields(event_dict),
        }
        if len(self._records) >= self.max_held:
            self._records.popleft()  # keep the newest: they explain the state the CP will see
            self._drop()
        self._records.append(record)
        if level in MIRRORED_LEVELS:
            mirror = self._mirrors.get(name)
            if mirror is None:
                mirror = self._mirrors[name] = _Bucket(MIRROR_BURST, now)
            if mirror.take(now, 1.0 / MIRROR_EVERY_S, MIRROR_BURST) and len(self._mirror) < self.max_held:
                self._mirror.append(record)
            else:
                self.mirror_dropped += 1
        return event_dict

    def _drop(self) -> None:
        self.dropped += 1
        self.dropped_total += 1

    # -- the pump's side -----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._records)

    def take_batch(self, max_records: int, max_bytes: int = BATCH_MAX_BYTES) -> tuple[list[dict[str, Any]], int]:
        """The oldest lines, up to `max_records` and about `max_bytes` encoded (at least one line), and
        the drop count since the last batch. The byte bound keeps a batch of long lines far below the
        control plane's event size limit (256 KiB by default), so it is never cut."""
        batch: list[dict[str, Any]] = []
        size = 0
        while self._records and len(batch) < max_records:
            record_size = len(msgspec.json.encode(self._records[0]))
            if batch and size + record_size > max_bytes:
                break
            batch.append(self._records.popleft())
            size += record_size
        dropped, self.dropped = self.dropped, 0
        return batch, dropped

    def take_mirrored(self) -> list[dict[str, Any]]:
        out = list(self._mirror)
        self._mirror.clear()
        return out


def diagnostic_of(record: dict[str, Any]) -> dict[str, Any]:
    """The lossless `diagnostic.reported` payload that mirrors one warning or error line."""
    severity = "error" if record["level"] in ("error", "critical", "exception") else "warning"
    return {
        "code": "driver.log",
        "severity": severity,
        "message": f"{record['logger']}: {record['message']}",
        "details": {"at": record["at"], "logger": record["logger"], "fields": record["fields"]},
    }
