"""Bounded provider.protocol diagnostics."""

from __future__ import annotations

from typing import Any

from driver.adapters.common.protocol_diagnostics import ProtocolDiagnostics
from driver.protocol.events import validate_payload


async def test_only_the_first_few_violations_become_events() -> None:
    emitted: list[dict[str, Any]] = []

    async def emit(kind: str, payload: dict[str, Any]) -> None:
        validate_payload(kind, payload)
        emitted.append(payload)

    report = ProtocolDiagnostics(emit, "the acp agent", limit=3)
    for _ in range(100):
        await report("a line that is not a JSON object (12 bytes)")
    assert report.count == 100
    assert len(emitted) == 4
    assert all(p["code"] == "provider.protocol" for p in emitted)
    assert "only counted" in emitted[-1]["message"]
