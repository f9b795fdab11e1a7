"""The provider's life under the kernel: start (bounded), watch for a death while idle, replace after
a crash or a forced kill (with backoff and crash-loop detection), signal its process groups, stop.

One `ProviderSupervisor` owns the current adapter. Every start is an `Attempt`; a run asks `ready()`
for a started adapter and so waits for a start or a replacement in progress, fails at once while a
crash loop is declared, and fails with the start's own error when the provider could not start.
Replacing an adapter is idempotent per adapter object, so the run path (which saw the crash as an
error) and the exit watcher (which saw the process go) never count one crash twice.

Building an adapter prepares what the agent can break (its home under `state_dir/providers/`): a
build that raises is a failed start like any other (`provider.start_failed`, retried with backoff,
counted by the crash-loop guard), never an exception out of the supervisor (issue 30: a home
replaced by a file made every later start exit 70). The supervisor's own tasks run on the kernel's
supervision boundary (driver.tasks).
"""

from __future__ import annotations

import contextlib
import signal
import time
import weakref
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import anyio

from driver import containment, guard, logs
from driver.adapters.common.base import Adapter, ProviderError, TurnOutcome
from driver.kernel.supervision import CrashWindow
from driver.protocol.commands import RunInput
from driver.tasks import Tasks

log = logs.get("driver.supervisor")

Emit = Callable[[str, dict[str, Any]], Awaitable[object]]


class Attempt:
    """One start of one adapter; `done` is set when it succeeded (`error is None`) or failed."""

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.error: ProviderError | None = None
        self.adapter: Adapter | None = None


class Unbuilt(Adapter):
    """What stands for an adapter whose build raised: its start fails with the build's error (so the
    failure takes the path of every failed start), and it has no process to signal or stop."""

    runtime = "unbuilt"
    capabilities = frozenset()

    def __init__(self, error: ProviderError) -> None:  # no config, no ports: nothing was built
        self.error = error

    async def start(self) -> None:
        raise self.error

    async def run(self, run_id: str, run_input: RunInput) -> TurnOutcome:
        raise self.error

    async def cancel(self) -> None:
        return None

    async def reset(self) -> tuple[str | None, str | None]:
        raise self.error

    async def stop(self) -> None:
        return None


class ProviderSupervisor:
    def __init__(
        self,
        new_adapter: Callable[[], Adapter],
        emit: Emit,
        *,
        start_timeout_s: float,
        stop_timeout_s: float,
        crashes: CrashWindow,
        on_ready: Callable[[], None] = lambda: None,
        on_lost: Callable[[], None] = lambda: None,
        on_exited: Callable[[Adapter], Awaitable[None]] | None = None,
        on_starting: Callable[[], None] = lambda: None,
        on_started: Callable[[ProviderError | None], None] = lambda error: None,
        notes: Callable[[], list[dict[str, Any]]] = list,
    ) -> None:
        self._new_adapter = new_adapter
        # Diagnostics the last build has to say (a home set aside): said as its start begins.
        self._notes = notes
        self._emit = emit
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.crashes = crashes
        self._on_ready = on_ready
        self._on_lost = on_lost
        # Called when the current adapter's process exited on its own (the kernel decides what a
        # death during a run means); default: replace it as a crash.
        self._on_exited = on_exited
        # Told when each start begins and how it ended (timings and the provider-start span).
        self._on_starting = on_starting
        self._on_started = on_started
        self.adapter: Adapter = self._build()
        self.attempt = Attempt()
        self.start_ms: float | None = None
        self.starts = 0
        self._tg: Tasks | None = None
        self._retired: weakref.WeakSet[Adapter] = weakref.WeakSet()
        self._watch_scope: anyio.CancelScope | None = None
        self._replace_scope: anyio.CancelScope | None = None
        self._stopping = False

    def bind(self, tg: Tasks) -> None:
        self._tg = tg

    def rebuild(self) -> None:
        """Build the adapter again before its first start (a checkpoint restored its session)."""
        self.adapter = self._build()

    def _build(self) -> Adapter:
        """A new adapter; an `Unbuilt` one carrying the error when building it raised."""
        try:
            return self._new_adapter()
        except ProviderError as exc:
            log.error("provider.build_failed", code=exc.code, message=exc.message)
            return Unbuilt(exc)
        except Exception as exc:
            kind, text = guard.describe(exc)
            log.error("provider.build_failed", error_type=kind, error=text, exc_info=True)
            message = f"the provider could not be prepared: {kind}: {text}"
            return Unbuilt(ProviderError("provider.start_failed", message, retryable=True))

    # -- starting --------------------------------------------------------------------------------
    async def boot(self) -> None:
        """The first start, at driver start (cancelled by `stop()`)."""
        scope = anyio.CancelScope()
        self._replace_scope = scope
        attempt = self.attempt
        with scope, self._settling():
            await self._start(attempt)
        if scope.cancel_called and not attempt.done.is_set():
            attempt.error = ProviderError("driver.stopping", "the driver is stopping", retryable=True)
            attempt.done.set()

    @contextlib.contextmanager
    def _settling(self) -> Iterator[None]:
        """A bug in a start or a replacement must not leave inputs waiting on it forever: the current
        attempt ends failed, and the exception goes on to the boundary, which reports it."""
        try:
            yield
        except Exception as exc:
            attempt = self.attempt
            if not attempt.done.is_set():
                message = guard.error_message("provider start", exc)
                attempt.error = ProviderError(guard.INTERNAL_ERROR, message, retryable=True)
                attempt.done.set()
            raise

    async def _start(self, attempt: Attempt) -> None:
        adapter = self.adapter
        for note in self._notes():
            await self._diagnostic(note["code"], note["severity"], note["message"], note.get("details"))
        t0 = time.monotonic()
        self._on_starting()
        error: ProviderError | None = None
        try:
            with anyio.fail_after(self.start_timeout_s):
                await adapter.start()
        except TimeoutError:
            error = ProviderError(
                "provider.start_timeout",
                f"the provider did not start within {self.start_timeout_s:g} s",
                retryable=True,
                details={"stderr_tail": adapter.stderr_tail()},
            )
        except ProviderError as exc:
            error = exc
        except Exception as exc:  # a provider bug must not take the driver down
            error = ProviderError("provider.start_failed", f"{type(exc).__name__}: {exc}", retryable=True)
        self.starts += 1
        self._on_started(error)
        if error is None:
            self.start_ms = (time.monotonic() - t0) * 1000
            attempt.adapter = adapter
            attempt.done.set()
            self._on_ready()
            if self.crashes.started():
                await self._diagnostic(
                    "provider.crash_loop_cleared", "info", "the provider started again; inputs are accepted"
                )
            self._watch(adapter)
            return
        log.error("provider.start_failed", code=error.code, message=error.message)
        # Whatever the failed start spawned must not outlive it.
        await self._stop_adapter(adapter)
        await self._diagnostic(error.code, "error", error.message, error.details)
        attempt.error = error
        if error.retryable and not self._stopping:
            # Counted as a crash: a provider that never starts is retried with backoff, and a loop of
            # failed starts trips the crash-loop guard like a loop of crashes does.
            self.lost(adapter, f"start failed: {error.code}", crashed=True, keep_attempt=attempt)
        attempt.done.set()

    async def ready(self) -> Adapter:
        """A started adapter, waiting for a start in progress; ProviderError when there is none."""
        if self.crashes.tripped:
            raise self.crash_loop_error()
        attempt = self.attempt
        await attempt.done.wait()
        if attempt.error is not None:
            raise attempt.error
        assert attempt.adapter is not None
        return attempt.adapter

    def crash_loop_error(self) -> ProviderError:
        return ProviderError(
            "provider.crash_loop",
            f"the provider crashed {self.crashes.count} times in {self.crashes.window_s:g} s; "
            "inputs fail until it starts again",
            retryable=True,
            details={"crashes": self.crashes.count, "window_s": self.crashes.window_s},
        )

    # -- watching ---------------------------------------------------------------------------------
    def _watch(self, adapter: Adapter) -> None:
        if self._tg is None:
            return
        scope = anyio.CancelScope()
        self._watch_scope = scope

        async def watch() -> None:
            with scope:
                await adapter.wait_exited()
            if scope.cancel_called or adapter in self._retired or self._stopping:
                return
            log.warning("provider.exited")
            if self._on_exited is not None:
                await self._on_exited(adapter)
            else:
                self.lost(adapter, "the provider exited", crashed=True)

        self._tg.spawn(watch)

    def unwatch(self) -> None:
        """Stop watching the current adapter (before an intentional stop or a reset that respawns)."""
        if self._watch_scope is not None:
            self._watch_scope.cancel()
            self._watch_scope = None

    def rewatch(self) -> None:
        self._watch(self.adapter)

    # -- replacing --------------------------------------------------------------------------------
    def lost(self, adapter: Adapter, reason: str, *, crashed: bool, keep_attempt: Attempt | None = None) -> None:
        """Replace `adapter` (once): stop it, back off if it crashed, start a fresh one.

        Inputs that arrive meanwhile wait for the replacement; `keep_attempt` keeps a failed start's
        error visible instead (so an input gets the clear start error rather than waiting again)."""
        if adapter in self._retired or self._stopping or adapter is not self.adapter:
            return
        self._retired.add(adapter)
        self.unwatch()
        self._on_lost()
        attempt = keep_attempt if keep_attempt is not None else Attempt()
        self.attempt = attempt
        assert self._tg is not None
        self._tg.spawn(self._replace, adapter, reason, crashed, attempt)

    async def _replace(self, old: Adapter, reason: str, crashed: bool, attempt: Attempt) -> None:
        scope = anyio.CancelScope()
        self._replace_scope = scope
        with scope, self._settling():
            await self._stop_adapter(old)
            delay = 0.0
            if crashed:
                was_tripped = self.crashes.tripped
                delay = self.crashes.record()
                if self.crashes.tripped and not was_tripped:
                    error = self.crash_loop_error()
                    await self._diagnostic(
                        error.code, "error", error.message, {**error.details, "limit": self.crashes.limit}
                    )
            await self._diagnostic(
                "provider.restarting",
                "warning",
                f"restarting the provider: {reason}",
                {"reason": reason, "crashed": crashed, "delay_ms": round(delay * 1000), "crashes": self.crashes.count},
            )
            await anyio.sleep(delay)
            if self._stopping:
                return
            self.adapter = self._build()
            # A kept (failed) attempt stays visible during the backoff; the new start gets its own.
            if attempt.done.is_set():
                attempt = Attempt()
                self.attempt = attempt
            await self._start(attempt)
            if attempt.error is None:
                await self._diagnostic(
                    "provider.restarted",
                    "info",
                    f"the provider was restarted: {reason}",
                    {"reason": reason, "start_ms": round(self.start_ms or 0.0, 1)},
                )
        if scope.cancel_called and not attempt.done.is_set():
            attempt.error = ProviderError("driver.stopping", "the driver is stopping", retryable=True)
            attempt.done.set()

    # -- signals and stopping ---------------------------------------------------------------------
    def signal(self, adapter: Adapter, sig: int) -> list[int]:
        """Send `sig` to the adapter's process groups; return the groups that existed."""
        hit: list[int] = []
        for pgid in adapter.process_group_ids():
            try:
                if containment.kill_group(pgid, sig):
                    hit.append(pgid)
            except PermissionError as exc:
                log.warning("provider.signal_failed", pgid=pgid, error=str(exc))
        return hit

    async def _stop_adapter(self, adapter: Adapter) -> None:
        """adapter.stop() within the bound; then SIGKILL whatever of its groups is left."""
        groups = adapter.process_group_ids()
        with anyio.CancelScope(shield=True):
            stopped = False
            with anyio.move_on_after(self.stop_timeout_s):
                try:
                    await adapter.stop()
                except Exception as exc:
                    log.warning("provider.stop_failed", error=str(exc))
                stopped = True
            if not stopped:
                log.warning("provider.stop_timeout", timeout_s=self.stop_timeout_s)
                for pgid in groups:
                    with contextlib.suppress(PermissionError):
                        containment.kill_group(pgid, signal.SIGKILL)

    async def stop(self) -> None:
        """Stop for good: no more replacements, the current provider stopped within the bound."""
        self._stopping = True
        self.unwatch()
        if self._replace_scope is not None:
            self._replace_scope.cancel()
        await self._stop_adapter(self.adapter)
        if not self.attempt.done.is_set():
            self.attempt.error = ProviderError("driver.stopping", "the driver is stopping", retryable=True)
            self.attempt.done.set()

    def kill_now(self) -> None:
        """SIGKILL every provider group at once (the driver is exiting without a clean stop)."""
        self._stopping = True
        self.signal(self.adapter, signal.SIGKILL)

    async def _diagnostic(self, code: str, severity: str, message: str, details: dict[str, Any] | None = None) -> None:
        payload: dict[str, Any] = {"code": code, "severity": severity, "message": message}
        if details:
            payload["details"] = details
        try:
            await self._emit("diagnostic.reported", payload)
        except Exception as exc:  # a diagnostic must never break supervision
            log.warning("diagnostic.failed", code=code, error=str(exc))
