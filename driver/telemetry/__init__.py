"""Observability of the driver and its provider: activity in heartbeats (PROTOCOL §2.5), the provider's
liveness and resource guard (§8), phase timings and the log uplink (§4.2), traces (§6.6).

Every module here is small and cheap to import except `tracing_otel`, which loads the OpenTelemetry SDK
and is imported only when a boot payload names an OTLP endpoint.
"""
