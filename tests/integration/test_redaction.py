"""One redactor for every log record (issue 20 item 3): the real driver at `--log-level debug`, where
`websockets` logs the request headers (Authorization included) through the standard library. The
control token and the provider's key appear nowhere: not in stderr, not in the `log.records` the
control plane stored, not in any `diagnostic.reported`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from agent_lab.testing.fakes import Fakes

from tests.integration.harness import INSTANCE, TOKEN, DriverProcess, boot_payload, control_plane
from tests.kernel.runtimes import RUNTIMES
from tests.kernel.runtimes import payload as runtime_payload

pytestmark = pytest.mark.anyio

PROVIDER_KEY = "provider-secret-777"


async def test_debug_logs_of_the_real_driver_never_carry_the_token(
    tmp_path: Path, drivers: list[DriverProcess]
) -> None:
    async with control_plane(tmp_path) as cp:
        d = DriverProcess(tmp_path, boot_payload(tmp_path, cp.url), args=("--log-level", "debug"))
        drivers.append(d)
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=30)
        cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": "[[say:hi]]"})
        assert (await cp.wait_for_command_status(cid, timeout=30))["status"] == "completed"
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "log.records", timeout=30)
        await cp.send_command(INSTANCE, "session.stop", reason="done")
        assert await d.wait(30) == 0
        stored = cp.events(INSTANCE)

    stderr = d.stderr()
    lines = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    # The third-party debug lines are there (so the test looks where the token would have been) ...
    ws_lines = [r for r in lines if str(r.get("logger", "")).startswith("websockets")]
    assert ws_lines, "no websockets debug line reached stderr"
    auth = [r for r in ws_lines if "Authorization" in r["event"]]
    assert auth and all("Bearer [redacted]" in r["event"] for r in auth)
    # ... and every line, ours or a library's, passed the redactor.
    assert TOKEN not in stderr and PROVIDER_KEY not in stderr
    copied = [e for e in stored if e["kind"] in ("log.records", "diagnostic.reported")]
    assert any(e["kind"] == "log.records" for e in copied)
    text = json.dumps(stored)
    assert TOKEN not in text and PROVIDER_KEY not in text


@pytest.fixture(scope="module")
def fakes() -> Iterator[Fakes]:
    with ExitStack() as stack:
        yield Fakes(stack)


@pytest.mark.provider
@pytest.mark.timeout(300)
@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_debug_logs_of_every_real_runtime_carry_no_secret(
    tmp_path: Path, drivers: list[DriverProcess], fakes: Fakes, runtime: str
) -> None:
    """The same at debug with each real runtime: the provider's stderr tail, its JSON-RPC heads (bytes
    fields) and the libraries' lines all pass the one redactor; the provider key is masked too."""
    payload = runtime_payload(runtime, tmp_path, "", fakes)
    secrets = [TOKEN, *payload["execution"]["environment"].values()]
    async with control_plane(tmp_path) as cp:
        payload["control"]["url"] = cp.url
        d = DriverProcess(tmp_path, payload, args=("--log-level", "debug"))
        drivers.append(d)
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=60)
        cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": "[[say:hi]]"})
        assert (await cp.wait_for_command_status(cid, timeout=120))["status"] == "completed"
        await cp.send_command(INSTANCE, "session.stop", reason="done")
        assert await d.wait(60) == 0
        stored = json.dumps(cp.events(INSTANCE))
    stderr = d.stderr()
    assert '"level":"debug"' in stderr
    for secret in secrets:
        assert secret not in stderr and secret not in stored, f"{runtime}: a secret reached the logs"
