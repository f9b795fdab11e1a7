"""The conformance kit (`agent-driver controlplane conformance`) against real control planes (issue 35):
it passes against the reference control plane and against examples/minimal_cp.py, and when one of the
reference's fault knobs breaks a rule, it fails that rule by name and exits 1.

The kit runs as the documented command, in a subprocess; the control planes run in this test's loop.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from agent_lab.controlplane.server import ControlPlane

from tests.examples.minimal import load

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]
TOKEN = "kit-token-0123456789"
INSTANCE = "drv-kit.1"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def kit(tmp: Path, url: str, api: str | None, *extra: str) -> tuple[int, dict[str, str], str]:
    """Run the kit; (exit status, rule → outcome, its output)."""
    token_file = tmp / "kit.token"
    token_file.write_text(TOKEN + "\n")
    args = ["controlplane", "conformance", "--url", url, "--token-file", str(token_file), "--instance", INSTANCE]
    if api is not None:
        args += ["--api", api]
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "driver.cli",
        *args,
        *extra,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    text = out.decode()
    outcomes = {}
    for line in text.splitlines():
        outcome, _, rest = line.partition(" ")
        if outcome in ("PASS", "FAIL", "SKIP"):
            outcomes[rest.split(":", 1)[0]] = outcome
    assert proc.returncode is not None
    return proc.returncode, outcomes, text + err.decode()


@asynccontextmanager
async def reference(tmp: Path, **faults: Any) -> AsyncIterator[tuple[str, str]]:
    async with ControlPlane(tmp / "cp.sqlite3", tokens={TOKEN: {INSTANCE}}, heartbeat_interval_ms=400) as cp:
        cp.faults.update(faults)
        yield cp.url, f"{cp.http_url}/api"


def failed(outcomes: dict[str, str]) -> set[str]:
    return {rule for rule, outcome in outcomes.items() if outcome == "FAIL"}


async def test_the_reference_control_plane_passes_every_rule(tmp_path: Path) -> None:
    async with reference(tmp_path) as (url, api):
        status, outcomes, text = await kit(tmp_path, url, api)
    assert status == 0, text
    assert set(outcomes.values()) == {"PASS"}, text
    for rule in (
        "handshake.welcome",
        "epoch.older_refused",
        "events.duplicates",
        "events.stored",
        "commands.replay",
        "liveness.silence",
    ):
        assert rule in outcomes, text
    # A second run against the same store starts above the epochs the first one left.
    async with reference(tmp_path) as (url, api):
        status, outcomes, text = await kit(tmp_path, url, api, "--no-liveness")
    assert status == 0, text


@pytest.mark.parametrize(
    ("faults", "broken"),
    [
        ({"reject_auth": True}, "handshake.welcome"),
        ({"withhold_receipts": True}, "events.receipt"),
        ({"reject_next_events": 8, "reject_retryable": False}, "events.accepted"),
        ({"max_frame_bytes": 200_000}, "events.big_batch"),
    ],
)
async def test_a_fault_knob_that_breaks_a_rule_is_named(tmp_path: Path, faults: dict[str, Any], broken: str) -> None:
    async with reference(tmp_path, **faults) as (url, api):
        status, outcomes, text = await kit(tmp_path, url, api, "--no-liveness", "--timeout", "2")
    assert status == 1, text
    assert broken in failed(outcomes), text
    line = next(x for x in text.splitlines() if x.startswith(f"FAIL {broken}:"))
    assert len(line) > len(f"FAIL {broken}: "), "the failure says what was seen"


async def test_partial_and_retryable_receipts_are_not_faults(tmp_path: Path) -> None:
    # PROTOCOL §4: an event left out of a receipt, or rejected as retryable, is resent; the kit does so.
    async with reference(tmp_path, partial_receipt_events=2) as (url, api):
        status, outcomes, text = await kit(tmp_path, url, api, "--no-liveness")
    assert status == 0 and not failed(outcomes), text
    accepted = next(x for x in text.splitlines() if x.startswith("PASS events.accepted:"))
    assert "left out of a receipt and resent" in accepted and "(0 left out" not in accepted, accepted


async def test_the_minimal_example_control_plane_passes_every_rule(tmp_path: Path) -> None:
    async with load().MinimalCP(tmp_path / "min.sqlite3", TOKEN, heartbeat_ms=400) as cp:
        status, outcomes, text = await kit(tmp_path, cp.url, f"http://127.0.0.1:{cp.api_port}/api")
    assert status == 0, text
    assert set(outcomes.values()) == {"PASS"}, text


async def test_without_an_api_the_store_and_command_rules_say_skip(tmp_path: Path) -> None:
    async with reference(tmp_path) as (url, _):
        status, outcomes, text = await kit(tmp_path, url, None, "--no-liveness")
    assert status == 0, text
    assert outcomes["events.stored"] == "SKIP" and outcomes["commands.status"] == "SKIP"
    assert outcomes["events.accepted"] == "PASS"


async def test_usage_errors_are_one_line(tmp_path: Path) -> None:
    status, _, text = await kit(tmp_path, "http://127.0.0.1:9/driver", None)
    assert status == 2 and "--url must be ws:// or wss://" in text and "Traceback" not in text
    status, _, text = await kit(tmp_path, "ws://127.0.0.1:9/driver", None)
    assert status == 2 and "cannot reach ws://127.0.0.1:9/driver" in text and "Traceback" not in text
