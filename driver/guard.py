"""The supervision boundary (issue 19, PROTOCOL §9: nothing the agent controls kills the driver).

An unexpected exception fails the unit it happened in, never the process:
- a run ends `run.failed{driver.internal_error}` (driver.kernel.runpath);
- a command ends `failed` with code `driver.internal_error` (driver.kernel.commands);
- a report (artifacts, side effects, file changes) is left out of the run's events;
- a task of the kernel ends, and a long-lived one is restarted when that is safe (`keep`);
- a provider's request to a port (ACP `fs/*`, terminals, permissions) is answered with an error.
Each is told to the control plane by a lossless `diagnostic.reported{code: driver.internal_error}` with
the exception's type and its message, redacted and cut, and logged with its traceback (the logs are
redacted too). The process itself exits only with the statuses of the README's table.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

import anyio

from driver import logs
from driver.protocol import paths

log = logs.get("driver.guard")


class Emits(Protocol):
    """What a report needs: the events port (the kernel, or an adapter's ports)."""

    def emit(self, kind: str, payload: dict[str, Any]) -> Awaitable[Any]: ...


INTERNAL_ERROR = "driver.internal_error"
MESSAGE_LIMIT = 300
# A long-lived task that keeps failing is restarted with this backoff (doubling up to the cap), so a
# fault that recurs at once costs a bounded amount of CPU and log.
RESTART_BASE_S = 0.5
RESTART_CAP_S = 30.0


def describe(exc: BaseException) -> tuple[str, str]:
    """(exception type, message): the message redacted (no secret the driver knows) and cut."""
    name = type(exc).__name__
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        inner_name, inner = describe(exc.exceptions[0])
        return inner_name, inner
    text = logs.REDACTOR.redact(str(exc))
    # A file name that is not UTF-8 may sit in the message: escaped, it encodes.
    text = paths.escaped(text)
    if len(text) > MESSAGE_LIMIT:
        text = text[: MESSAGE_LIMIT - 1] + "…"
    return name, text


def error_message(unit: str, exc: BaseException) -> str:
    kind, text = describe(exc)
    return f"{unit}: unexpected {kind}: {text}" if text else f"{unit}: unexpected {kind}"


async def report(k: Emits, unit: str, exc: BaseException, **details: Any) -> None:
    """Log `exc` with its traceback and admit the lossless diagnostic; never raises."""
    kind, text = describe(exc)
    log.error("driver.internal_error", unit=unit, error_type=kind, error=text, exc_info=True)
    payload = {
        "code": INTERNAL_ERROR,
        "severity": "error",
        "message": error_message(unit, exc),
        "details": {"unit": unit, "exception_type": kind, **details},
    }
    try:
        await k.emit("diagnostic.reported", payload)
    except Exception:
        # The events port itself is broken: the log line above is all that can be said.
        log.error("driver.internal_error_unreported", unit=unit, exc_info=True)


async def supervised(k: Emits, fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> None:
    """Run one task; an unexpected exception ends it (reported), not the kernel's task group."""
    try:
        await fn(*args)
    except Exception as exc:
        await report(k, f"task {_name(fn)}", exc)


async def keep(k: Emits, name: str, fn: Callable[[], Coroutine[Any, Any, Any]]) -> None:
    """Run a long-lived task for the process's life: restarted after an unexpected exception (with
    backoff), and done for good when it returns."""
    delay = RESTART_BASE_S
    while True:
        try:
            await fn()
            return
        except Exception as exc:
            await report(k, f"task {name}", exc, restarting_in_s=delay)
        await anyio.sleep(delay)
        delay = min(RESTART_CAP_S, delay * 2)


async def essential(
    name: str, fn: Callable[[], Coroutine[Any, Any, Any]], on_failure: Callable[[], Awaitable[None]]
) -> None:
    """A task the driver cannot run without (the outbox's journal writer): restarting it could reorder
    what it writes, so its failure is the process's (`on_failure` exits 70; the journal keeps what was
    not sent and the next process resends it). Logged only: admitting a diagnostic needs that task."""
    try:
        await fn()
    except Exception as exc:
        kind, text = describe(exc)
        log.critical("driver.internal_error", unit=f"task {name}", error_type=kind, error=text, exc_info=True)
        await on_failure()


def _name(fn: Callable[..., Any]) -> str:
    return str(getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__)


class PortErrors:
    """For an adapter's JSON-RPC peer: a provider's request or notification whose handler (a port the
    driver serves: ACP `fs/*`, terminals, permissions, ...) raised. The request is answered with an
    error by the peer; this reports it, at most `limit` times per peer (a provider that repeats a
    request that fails must not flood the outbox with diagnostics), then logs only."""

    def __init__(self, emit: Callable[[str, dict[str, Any]], Awaitable[Any]], peer: str, limit: int = 20) -> None:
        self._emit = emit
        self.peer = peer
        self.limit = limit
        self.count = 0

    async def emit(self, kind: str, payload: dict[str, Any]) -> Any:
        return await self._emit(kind, payload)

    async def __call__(self, method: str, exc: BaseException) -> None:
        self.count += 1
        if self.count > self.limit:
            kind, text = describe(exc)
            log.error("driver.internal_error", unit=f"{self.peer} {method}", error_type=kind, error=text)
            return
        await report(self, f"{self.peer} {method}", exc, method=method, reported=self.count, limit=self.limit)
