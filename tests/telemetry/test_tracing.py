"""Traces through the real driver process (PROTOCOL §6.6): spans exported over OTLP/HTTP to a local
receiver, the run span a child of `input.start.traceparent` (else of the boot payload's), the trace
context handed to the provider process (TRACEPARENT at spawn, ACP `_meta.traceparent` per prompt), and
OpenTelemetry never imported by a driver without an endpoint."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from agent_lab.testing.otlp_receiver import OtlpReceiver, ReceivedSpan

from driver.telemetry.tracing import valid
from tests.integration.harness import INSTANCE, boot_payload, control_plane
from tests.kernel.support import Driver
from tests.kernel.test_supervision import FAST

BOOT_TRACE = "0af7651916cd43dd8448eb211c80319c"
BOOT_SPAN = "b7ad6b7169203331"
RUN_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
RUN_SPAN = "00f067aa0ba902b7"


@pytest.fixture
def otlp() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as receiver:
        yield receiver


def start(tmp: Path, url: str, drivers: list[Driver], **payload_fields: Any) -> Driver:
    payload = boot_payload(tmp, url)
    payload.update(payload_fields)
    payload["execution"]["environment"]["OTLP_AUTH"] = "Bearer otlp-secret-4242"
    d = Driver(tmp, payload, env={**FAST, "PYTHONPROFILEIMPORTTIME": "1"})
    drivers.append(d)
    return d


async def reply_of(cp: Any, run_id: str, text: str, **fields: Any) -> str:
    cid, _ = await cp.send_command(INSTANCE, "input.start", run_id=run_id, input={"text": text}, **fields)
    status = await cp.wait_for_command_status(cid, timeout=30)
    assert status["status"] == "completed", status
    (done,) = [e for e in cp.events(INSTANCE, run_id=run_id) if e["kind"] == "run.completed"]
    return str(done["payload"]["final_message_text"])


async def span(otlp: OtlpReceiver, name: str, **attributes: Any) -> ReceivedSpan:
    def match(s: ReceivedSpan) -> bool:
        return s.name == name and all(s.attributes.get(k) == v for k, v in attributes.items())

    return await anyio.to_thread.run_sync(lambda: otlp.wait_for(match, timeout=20))


def test_traceparent_validation() -> None:
    assert valid(f"00-{BOOT_TRACE}-{BOOT_SPAN}-01") is not None
    for bad in (None, "", "junk", f"00-{'0' * 32}-{BOOT_SPAN}-01", f"ff-{BOOT_TRACE}-{BOOT_SPAN}-01"):
        assert valid(bad) is None


async def test_spans_and_context_reach_the_collector_and_the_provider(
    tmp_path: Path, drivers: list[Driver], otlp: OtlpReceiver
) -> None:
    async with control_plane(tmp_path) as cp:
        d = start(
            tmp_path,
            cp.url,
            drivers,
            traceparent=f"00-{BOOT_TRACE}-{BOOT_SPAN}-01",
            telemetry={"otlp_endpoint": otlp.base_url, "headers_from_env": {"Authorization": "OTLP_AUTH"}},
        )
        # A run with its own trace context: its span is that context's child, and the provider's
        # prompt carries the run span's context.
        meta = json.loads(await reply_of(cp, "run-traced", "[[meta]]", traceparent=f"00-{RUN_TRACE}-{RUN_SPAN}-01"))
        run_span = await span(otlp, "agent_driver.run", **{"run.id": "run-traced"})
        assert (run_span.trace_id, run_span.parent_span_id) == (RUN_TRACE, RUN_SPAN)
        assert meta == {"traceparent": run_span.traceparent}
        # A run without one: a child of the boot payload's traceparent.
        await reply_of(cp, "run-plain", "[[say:plain]]")
        plain = await span(otlp, "agent_driver.run", **{"run.id": "run-plain"})
        assert (plain.trace_id, plain.parent_span_id) == (BOOT_TRACE, BOOT_SPAN)
        # The provider process got the session's context in its environment.
        env_traceparent = await reply_of(cp, "run-env", "[[env:TRACEPARENT]]")
        # And the exporter settings a runtime built on an OpenTelemetry SDK reads (headers in env only).
        assert await reply_of(cp, "run-endpoint", "[[env:OTEL_EXPORTER_OTLP_ENDPOINT]]") == otlp.base_url
        headers = await reply_of(cp, "run-headers", "[[env:OTEL_EXPORTER_OTLP_HEADERS]]")
        assert headers == "Authorization=Bearer%20otlp-secret-4242"
        # A permission wait is a span of its run.
        cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-perm", input={"text": "[[perm]]"})
        asked = await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "permission.requested", timeout=20)
        allow = next(o["option_id"] for o in asked["payload"]["options"] if o["kind"] == "allow_once")
        await cp.send_command(
            INSTANCE, "permission.resolve", request_id=asked["payload"]["request_id"], option_id=allow
        )
        assert (await cp.wait_for_command_status(cid, timeout=20))["status"] == "completed"
        wait = await span(otlp, "agent_driver.permission.wait")
        perm_run = await span(otlp, "agent_driver.run", **{"run.id": "run-perm"})
        assert wait.parent_span_id == perm_run.span_id and wait.trace_id == perm_run.trace_id
        # The session and provider-start spans are exported at stop.
        await cp.send_command(INSTANCE, "session.stop", reason="done")
        assert await d.wait() == 0
        session = await span(otlp, "agent_driver.session")
        assert (session.trace_id, session.parent_span_id) == (BOOT_TRACE, BOOT_SPAN)
        assert session.resource["agent_driver.instance_id"] == INSTANCE
        assert env_traceparent == session.traceparent
        start_span = await span(otlp, "agent_driver.provider.start")
        assert start_span.parent_span_id == session.span_id and start_span.status_code != 2
        assert all(h.get("authorization") == "Bearer otlp-secret-4242" for h in otlp.headers)
        assert "opentelemetry" in d.stderr()  # imported: an endpoint was configured


async def test_without_an_endpoint_opentelemetry_is_never_imported(tmp_path: Path, drivers: list[Driver]) -> None:
    async with control_plane(tmp_path) as cp:
        d = start(tmp_path, cp.url, drivers, traceparent=f"00-{BOOT_TRACE}-{BOOT_SPAN}-01")
        # The context still reaches the provider, unchanged: there is no span of ours to insert.
        assert await reply_of(cp, "run-1", "[[env:TRACEPARENT]]") == f"00-{BOOT_TRACE}-{BOOT_SPAN}-01"
        meta = json.loads(await reply_of(cp, "run-2", "[[meta]]", traceparent=f"00-{RUN_TRACE}-{RUN_SPAN}-01"))
        assert meta == {"traceparent": f"00-{RUN_TRACE}-{RUN_SPAN}-01"}
        await cp.send_command(INSTANCE, "session.stop", reason="done")
        assert await d.wait() == 0
        imports = d.stderr()
        assert "import time:" in imports and "driver.kernel" in imports  # the import log is there...
        assert "opentelemetry" not in imports  # ...and never names OpenTelemetry


async def test_an_endpoint_without_the_sdk_installed_runs_untraced_and_says_so(
    tmp_path: Path, drivers: list[Driver]
) -> None:
    shadow = tmp_path / "shadow" / "opentelemetry"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('opentelemetry is not installed here')\n")
    async with control_plane(tmp_path) as cp:
        payload = boot_payload(tmp_path, cp.url)
        payload["telemetry"] = {"otlp_endpoint": "http://127.0.0.1:9"}
        d = Driver(tmp_path, payload, env={**FAST, "PYTHONPATH": str(shadow.parent)})
        drivers.append(d)
        assert await reply_of(cp, "run-1", "[[say:still here]]") == "still here"
        said = await cp.wait_for_event(
            INSTANCE,
            lambda e: e["kind"] == "diagnostic.reported" and e["payload"]["code"] == "driver.log",
            timeout=20,
        )
        assert said["payload"]["severity"] == "error"
        assert said["payload"]["message"] == "driver.telemetry: telemetry.unavailable"
        assert "not installed here" in said["payload"]["details"]["fields"]["error"]
