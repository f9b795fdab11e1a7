"""The kernel's observability room: activity for heartbeats, the liveness rule, the resource guard,
phase timings, the log uplink's pump and the driver's spans.

The kernel calls it at a handful of points (every event it admits, hello, heartbeat, welcome, a
provider start, a run's start and end); everything else is derived from the event stream: a tool's
start and end, the provider's output, the first token, permission waits and host tool calls.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import anyio

from driver import logs
from driver.adapters.common.base import Adapter, ProviderError
from driver.kernel.runs import Run
from driver.protocol.events import RUN_TERMINALS
from driver.protocol.frames import HeartbeatActivity
from driver.telemetry import log_uplink, tracing
from driver.telemetry.timings import Timings, process_start_monotonic

if TYPE_CHECKING:
    from driver.kernel.core import Kernel
    from driver.protocol.commands import InputStart
    from driver.telemetry.activity import ActivityTracker
    from driver.telemetry.liveness import Verdict

log = logs.get("driver.telemetry")

# Events that are the provider speaking (its output, for liveness and `last_provider_output_ms_ago`).
# Not the kernel's own run.started / terminals / diagnostics.
PROVIDER_OUTPUT = frozenset(
    {
        "message.started",
        "message.delta",
        "message.completed",
        "thought.started",
        "thought.delta",
        "thought.completed",
        "tool.started",
        "tool.output.delta",
        "tool.completed",
        "permission.requested",
        "host_tool.called",
        "file.changed",
        "plan.updated",
        "usage.updated",
    }
)
LOG_BATCH_RECORDS = 100
PUMP_INTERVAL_S = 1.0
EXPORT_SHUTDOWN_S = 3.0


class TelemetryRoom:
    def __init__(self, kernel: Kernel) -> None:
        self.k = kernel
        boot = kernel.boot
        self._tracker: ActivityTracker | None = None
        self.timings = Timings(
            Path(boot.session.state_dir) / "driver" / "provider-started", process_start=process_start_monotonic()
        )
        self.uplink: log_uplink.LogUplink | None = logs.UPLINK
        self.welcomed = False
        self._wake = anyio.Event()
        self._starting = False
        self.tracer = tracing.make_tracer(
            boot.telemetry,
            boot.execution.environment,
            {"agent_driver.instance_id": boot.driver_instance_id, "session.id": boot.session.id},
        )
        self.boot_traceparent = tracing.valid(boot.traceparent)
        self.session_span = self.tracer.start(
            "agent_driver.session", self.boot_traceparent, {"session.kind": boot.session.kind}
        )
        self._provider_span: tracing.Span | None = None
        self._run_span: tracing.Span | None = None
        self._waits: dict[str, tracing.Span] = {}  # permission request / host tool call id → span

    @property
    def tracker(self) -> ActivityTracker:
        """Built at first use (the first heartbeat, after `hello`): /proc reading is not on the path
        to `hello`, whose start-up time is measured."""
        if self._tracker is None:
            from driver.telemetry.activity import ActivityTracker

            self._tracker = ActivityTracker(lambda: self.k.adapter.process_group_ids())
        return self._tracker

    # -- the provider's environment ---------------------------------------------------------------
    def provider_env(self) -> dict[str, str]:
        """TRACEPARENT for a provider process, plus the standard OpenTelemetry exporter settings when
        an endpoint is configured (runtimes built on an OpenTelemetry SDK read them)."""
        env: dict[str, str] = {}
        traceparent = self.session_span.traceparent
        if traceparent:
            env["TRACEPARENT"] = traceparent
        telemetry = self.k.boot.telemetry
        if telemetry is not None:
            env["OTEL_EXPORTER_OTLP_ENDPOINT"] = telemetry.otlp_endpoint
            env["OTEL_EXPORTER_OTLP_PROTOCOL"] = "http/protobuf"
            environment = self.k.boot.execution.environment
            headers = {h: environment[v] for h, v in telemetry.headers_from_env.items() if v in environment}
            if headers:
                # The standard variable's format: comma-separated, values percent-encoded. In the
                # process environment only (the provider gets execution.environment anyway).
                env["OTEL_EXPORTER_OTLP_HEADERS"] = ",".join(f"{h}={quote(v, safe='')}" for h, v in headers.items())
            if self.k.boot.execution.runtime == "claude-agent-sdk":
                # Claude Code's own OpenTelemetry: traces only (its enhanced-telemetry beta), to the
                # same collector, parented by TRACEPARENT.
                env.update(
                    {
                        "CLAUDE_CODE_ENABLE_TELEMETRY": "1",
                        "CLAUDE_CODE_ENHANCED_TELEMETRY_BETA": "1",
                        "OTEL_TRACES_EXPORTER": "otlp",
                        "OTEL_METRICS_EXPORTER": "none",
                        "OTEL_LOGS_EXPORTER": "none",
                    }
                )
        return env

    # -- hooks the kernel calls -------------------------------------------------------------------
    def hello_sent(self, at: float | None = None) -> None:
        self.timings.hello_sent(at)
        self._wake_soon()

    def heartbeat_activity(self) -> HeartbeatActivity | None:
        try:
            return self.tracker.activity()
        except Exception as exc:  # reading /proc must never take the heartbeat (and the link) down
            log.warning("activity.unreadable", error=f"{type(exc).__name__}: {exc}")
            return None

    def on_welcome(self) -> None:
        self.welcomed = True
        self._wake_soon()

    def provider_starting(self) -> None:
        self._starting = True
        current = self.k.provider.current
        self.timings.provider_starting(current.value if current is not None else None)
        if self._provider_span is not None:
            self._provider_span.end("superseded")
        self._provider_span = self.tracer.start(
            "agent_driver.provider.start", self.session_span.traceparent, {"runtime": self.k.boot.execution.runtime}
        )
        self._wake_soon()

    def provider_started(self, error: ProviderError | None) -> None:
        """A start finished (ready, or failed with `error`)."""
        self._starting = False
        if error is None:
            self.timings.provider_ready(self.k.adapter.native_id)
        if self._provider_span is not None:
            self._provider_span.end(None if error is None else error.code)
            self._provider_span = None
        self._wake_soon()

    def run_starting(self, command: InputStart) -> None:
        """In the run's own task, before the provider is asked: the run span and its trace context."""
        parent = tracing.valid(command.traceparent) or self.boot_traceparent or self.session_span.traceparent
        self._run_span = self.tracer.start("agent_driver.run", parent, {"run.id": command.run_id})
        tracing.set_run_traceparent(self._run_span.traceparent)

    def observe(self, kind: str, payload: dict[str, Any]) -> None:
        """Every event the kernel admits passes here (cheap: a few set lookups)."""
        if kind in PROVIDER_OUTPUT:
            self.tracker.provider_output()
            self.timings.maybe_first_token(kind)
            if kind == "tool.started":
                self.tracker.tool_started(str(payload.get("tool_call_id")))
            elif kind == "tool.completed":
                self.tracker.tool_finished(str(payload.get("tool_call_id")))
            elif kind == "permission.requested":
                self._wait_started("agent_driver.permission.wait", str(payload.get("request_id")))
            elif kind == "host_tool.called":
                self._wait_started(
                    "agent_driver.host_tool.call", str(payload.get("call_id")), {"tool.name": payload.get("name")}
                )
        elif kind == "permission.resolved":
            self._wait_ended(str(payload.get("request_id")), payload.get("outcome"))
        elif kind == "host_tool.resolved":
            self._wait_ended(str(payload.get("call_id")), payload.get("outcome"))
        elif kind == "run.started":
            self.timings.run_started(str(payload.get("run_id")))
        elif kind in RUN_TERMINALS:
            self.timings.run_ended()
            self.tracker.run_ended()
            if self._run_span is not None:
                error = payload.get("error")
                self._run_span.end(error.get("code") if isinstance(error, dict) else None)
                self._run_span = None
        elif kind == "runtime.resume.updated" and self._starting:
            self.timings.session_known(payload.get("value"))
        elif kind == "runtime.session.reset" and self.k.provider.resetting:
            self.timings.session_known(payload.get("current"), reset=True)
        if self.timings.pending:
            self._wake_soon()

    def _wait_started(self, name: str, key: str, attributes: dict[str, Any] | None = None) -> None:
        parent = self._run_span.traceparent if self._run_span is not None else self.session_span.traceparent
        self._waits[key] = self.tracer.start(name, parent, {k: v for k, v in (attributes or {}).items() if v})

    def _wait_ended(self, key: str, outcome: Any) -> None:
        span = self._waits.pop(key, None)
        if span is not None:
            span.end(None if outcome in ("allowed", "completed") else str(outcome))

    # -- liveness (PROTOCOL §8) ---------------------------------------------------------------------
    async def watch_silence(self, run: Run, adapter: Adapter, scope: anyio.CancelScope) -> None:
        """End the run as provider.unresponsive when its provider tree neither spoke nor worked for
        the silence limit while nothing waited on the control plane."""
        k = self.k
        limit = k.options.provider_silence_timeout_s
        if limit <= 0:
            return
        from driver.telemetry import liveness  # the first run's, not the start-up's import

        verdict: Verdict | None = None

        def cpu_ms() -> float:
            self.tracker.sample()
            return self.tracker.cpu_ms

        def waiting() -> bool:
            return bool(k.permissions.pending_count or k.host_tools.pending_count or run.cancel_requested_by)

        with scope:
            verdict = await liveness.watch(
                limit,
                cpu_ms=cpu_ms,
                last_output=lambda: self.tracker.last_output,
                waiting_on_cp=waiting,
                clock=time.monotonic,
            )
        if scope.cancel_called or verdict is None:
            return
        used = verdict.cpu_ms_in_window
        log.error("run.provider_unresponsive", run_id=run.run_id, quiet_s=round(verdict.quiet_s, 1), cpu_ms=used)
        run.forced_error = ProviderError(
            "provider.unresponsive",
            f"the provider tree produced no output and used under 1% of a core for {limit:g} s during the run",
            retryable=True,
            details={"stderr_tail": adapter.stderr_tail(), "quiet_s": round(verdict.quiet_s, 1), "cpu_ms": used},
        )
        run.scope.cancel()

    # -- resource guard (PROTOCOL §8) -----------------------------------------------------------------
    async def after_run(self, run: Run) -> None:
        """Between runs: replace a provider whose tree grew above `limits.provider_rss_mb`."""
        limit = self.k.boot.execution.limits.provider_rss_mb
        adapter = run.adapter
        if limit is None or adapter is None or adapter is not self.k.adapter or self.k.stopping:
            return
        rss = self.tracker.sample().rss_mb
        if rss <= limit:
            return
        reason = f"the provider tree's RSS {rss:.1f} MB is above limits.provider_rss_mb {limit:g}"
        log.warning("provider.recycled", rss_mb=round(rss, 1), limit_mb=limit)
        current = self.k.provider.current
        await self.k.emit(
            "diagnostic.reported",
            {
                "code": "provider.recycled",
                "severity": "info",
                "message": f"replacing the provider between runs: {reason}",
                "details": {
                    "rss_mb": round(rss, 1),
                    "limit_mb": limit,
                    "after_run_id": run.run_id,
                    "resumes": current.value if current is not None else None,
                },
            },
        )
        self.k.supervisor.lost(adapter, reason, crashed=False)

    # -- the pump: timings, log batches, mirrored warnings ------------------------------------------
    def _wake_soon(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        """For the process's life: emit what the timings and the log uplink collected."""
        while True:
            with anyio.move_on_after(PUMP_INTERVAL_S):
                await self._wake.wait()
            self._wake = anyio.Event()
            with log_uplink.not_copied():
                await self.flush()

    async def flush(self) -> None:
        for record in self.timings.take():
            await self.k.emit("runtime.timing.recorded", record)
        uplink = self.uplink
        if uplink is None:
            return
        for record in uplink.take_mirrored():
            await self.k.emit("diagnostic.reported", log_uplink.diagnostic_of(record))
        # Lines from before the first welcome are held; after it they are best-effort like any other.
        while self.welcomed and (len(uplink) or uplink.dropped):
            records, dropped = uplink.take_batch(LOG_BATCH_RECORDS)
            await self.k.emit("log.records", {"records": records, "dropped": dropped})
            if not records:
                break

    async def shutdown(self) -> None:
        """At exit: the last timings and lines are admitted, the spans exported (both bounded: a full
        outbox or an unreachable collector must not hold the exit)."""
        with anyio.move_on_after(1.0), log_uplink.not_copied():
            await self.flush()
        self.session_span.end()
        if not isinstance(self.tracer, tracing.NoTracer):
            with anyio.move_on_after(EXPORT_SHUTDOWN_S + 1):
                await anyio.to_thread.run_sync(self.tracer.shutdown, EXPORT_SHUTDOWN_S, abandon_on_cancel=True)
