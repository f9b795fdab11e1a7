"""wss:// with certificate verification: a driver trusts the CP only through `control.ca_file`."""

from __future__ import annotations

import json
import os
import ssl
import sys
from pathlib import Path

import anyio

from tests.controlplane.client import self_signed_cert
from tests.integration.harness import INSTANCE, ROOT, DriverProcess, boot_payload, control_plane


async def _stderr_until(proc: anyio.abc.Process, needle: bytes, timeout: float) -> bytes:
    """Read the process's stderr as it comes until `needle` appears (the wait is on the stream)."""
    assert proc.stderr is not None
    seen = b""
    with anyio.fail_after(timeout):
        async for chunk in proc.stderr:
            seen += chunk
            if needle in seen.lower():
                return seen
    raise AssertionError(f"stderr ended without {needle!r}: {seen[-2000:]!r}")


async def test_wss_with_ca_file_connects_and_without_it_is_refused(tmp_path: Path) -> None:
    cert, key = self_signed_cert(tmp_path)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    async with control_plane(tmp_path, ssl_context=ctx) as cp:
        assert cp.url.startswith("wss://")

        # Without the CA: TLS verification fails at every dial; the driver never says hello.
        untrusted_dir = tmp_path / "untrusted"
        untrusted_dir.mkdir()
        boot = untrusted_dir / "boot.json"
        boot.write_text(json.dumps(boot_payload(untrusted_dir, cp.url)))
        boot.chmod(0o600)
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_DRIVER")}
        env["AGENT_DRIVER_PROJECT_ROOT"] = str(ROOT)
        untrusted = await anyio.open_process(
            [sys.executable, "-m", "driver.cli", "run", "--boot-file", str(boot)], env=env, cwd=ROOT
        )
        try:
            await _stderr_until(untrusted, b"certificate verify failed", timeout=30)
            assert untrusted.returncode is None  # it keeps retrying, as for any transient failure
            assert cp.hello(INSTANCE) is None
        finally:
            untrusted.kill()
            await untrusted.wait()

        # With the CA in `control.ca_file`: connected, hello received from this very process.
        trusted_dir = tmp_path / "trusted"
        trusted_dir.mkdir()
        payload = boot_payload(trusted_dir, cp.url)
        payload["control"]["ca_file"] = str(cert)
        trusted = DriverProcess(trusted_dir, payload, "trusted")
        try:
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=30)
            hello = cp.hello(INSTANCE)
            assert hello is not None and hello["pid"] == trusted.pid
        finally:
            trusted.close()
