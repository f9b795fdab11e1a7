"""The driver never writes through a link the agent planted (issue 30, PROTOCOL §9, THREATS.md item 2).

Through the REAL driver and the REAL Codex runtime: Codex's own shell tool (the agent) replaces
`codex-home/config.toml` in its provider folder with a link to a file outside, then its provider is
killed (the agent can kill its own provider at any moment) so the driver writes CODEX_HOME again for
the replacement. Before the fix `Path.write_text` truncated whatever the link named (a symlink there
made the driver overwrite its own hidden journal); now the link is replaced, its target untouched.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.integration.harness import INSTANCE, control_plane
from tests.kernel import runtimes
from tests.kernel.runtimes import Fakes
from tests.kernel.support import Driver, wait_diagnostic, wait_provider

FAST = {"AGENT_DRIVER_RESTART_BACKOFF_MS": "20", "AGENT_DRIVER_RESTART_BACKOFF_CAP_MS": "100"}


@pytest.mark.provider
async def test_a_link_planted_at_codex_config_is_replaced_not_written_through(
    tmp_path: Path, drivers: list[Driver], fakes: Fakes
) -> None:
    outside = tmp_path / "precious.txt"
    outside.write_text("precious")
    config = tmp_path / "state" / "providers" / "openai-app-server" / "codex-home" / "config.toml"
    async with control_plane(tmp_path) as cp:
        payload = runtimes.payload("openai-app-server", tmp_path, cp.url, fakes)
        payload["execution"]["permission_policy"] = "full_access"
        d = Driver(tmp_path, payload, env=FAST)
        drivers.append(d)
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=60)
        pgid = await wait_provider(d)
        assert config.is_file() and not config.is_symlink()
        # Codex's own shell tool plants the link.
        text = f"[[shell:ln -sf {outside} {config}]]"
        cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": text})
        assert (await cp.wait_for_command_status(cid, timeout=60))["status"] == "completed"
        assert config.is_symlink(), "the agent's tool could not plant the link: the attack did not run"
        os.killpg(pgid, signal.SIGKILL)
        exited = await wait_diagnostic(cp, "provider.exited", timeout=30)
        await wait_diagnostic(cp, "provider.restarted", after_seq=exited["seq"], timeout=60)
        assert outside.read_text() == "precious"  # the link's target is untouched
        assert config.is_file() and not config.is_symlink()  # the driver's config replaced the link
        assert config.read_text() != "precious"
        cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-2", input={"text": "[[say:fine]]"})
        assert (await cp.wait_for_command_status(cid, timeout=60))["status"] == "completed"
