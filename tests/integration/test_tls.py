"""wss:// with certificate verification: a driver trusts the CP only through `control.ca_file`."""

from __future__ import annotations

import ssl
from pathlib import Path

from tests.controlplane.client import self_signed_cert
from tests.integration.harness import INSTANCE, DriverProcess, boot_payload, control_plane


async def test_wss_with_ca_file_connects_and_without_it_is_refused(tmp_path: Path) -> None:
    cert, key = self_signed_cert(tmp_path)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    async with control_plane(tmp_path, ssl_context=ctx) as cp:
        assert cp.url.startswith("wss://")
        untrusted_dir = tmp_path / "untrusted"
        untrusted_dir.mkdir()
        untrusted = DriverProcess(untrusted_dir, boot_payload(untrusted_dir, cp.url), "untrusted")
        try:
            trusted_dir = tmp_path / "trusted"
            trusted_dir.mkdir()
            payload = boot_payload(trusted_dir, cp.url)
            payload["control"]["ca_file"] = str(cert)
            trusted = DriverProcess(trusted_dir, payload, "trusted")
            try:
                await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=30)
                hello = cp.hello(INSTANCE)
                assert hello is not None and hello["pid"] == trusted.pid
                # The driver without the CA never got past TLS: it keeps retrying, it never said hello.
                assert untrusted.proc.poll() is None
                assert (
                    "CERTIFICATE_VERIFY_FAILED" in untrusted.stderr()
                    or "certificate verify failed" in untrusted.stderr()
                )
            finally:
                trusted.close()
        finally:
            untrusted.close()
