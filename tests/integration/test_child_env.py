"""Secrets by value, not by name (issue 30, THREATS 9, PROTOCOL §6.7, §6.8): with the model proxy on, a
§6.7 secret of `execution.environment` reaches no child of the driver under ANY name: not under a second
variable of the payload, not under a name the control plane puts in `process.start{env}`, and neither
does the control token. Through the real driver: the child prints its whole environment."""

from __future__ import annotations

from pathlib import Path

from tests.integration.harness import INSTANCE, TOKEN, DriverProcess, boot_payload, control_plane
from tests.integration.processes_support import screen, start_process, wait_exited

SECRET = "provider-secret-777"  # the harness's FAKE_PROVIDER_KEY


async def test_a_withheld_secret_under_another_name_reaches_no_process(
    tmp_path: Path, drivers: list[DriverProcess]
) -> None:
    async with control_plane(tmp_path) as cp:
        payload = boot_payload(tmp_path, cp.url)
        payload["execution"]["environment"] |= {"SECOND_NAME": SECRET, "HARMLESS": "visible-1"}
        payload["execution"]["model_proxy"] = {"secrets": ["FAKE_PROVIDER_KEY"]}
        d = DriverProcess(tmp_path, payload)
        drivers.append(d)
        await cp.wait_connected(INSTANCE, timeout=20)
        extra = {"ALIAS": SECRET, "TOKEN_ALIAS": TOKEN, "EXTRA": "added-2"}
        await start_process(cp, "env", argv=["env", "-0"], env=extra)
        await wait_exited(cp, "env")
        text, _ = screen(cp, "env")
        env = dict(entry.split("=", 1) for entry in text.split("\0") if "=" in entry)
        # What was asked for and is no secret is there: the output was read.
        assert env["HARMLESS"] == "visible-1" and env["EXTRA"] == "added-2"
        assert SECRET not in text and TOKEN not in text
        assert not {"FAKE_PROVIDER_KEY", "SECOND_NAME", "ALIAS", "TOKEN_ALIAS"} & env.keys()
