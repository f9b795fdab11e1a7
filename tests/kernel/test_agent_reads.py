"""What the driver reads in the agent's folders is bounded and never blocks it (issue 30 follow-up,
PROTOCOL §9 "What the agent can write is input", THREATS.md items 3 and 4).

Through the REAL driver process and our stubborn ACP agent, whose `[[own-shell:]]` tool runs a command
as the agent's own child (inside the provider tree): the agent reshapes a file the driver reads at the
next provider start, then kills its provider, so the driver's restart path meets it.
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path
from typing import Any

from tests.integration.harness import INSTANCE, boot_payload, control_plane
from tests.kernel.support import Driver, wait_diagnostic, wait_provider

FAST = {
    "AGENT_DRIVER_CANCEL_GRACE_MS": "300",
    "AGENT_DRIVER_TERM_GRACE_MS": "300",
    "AGENT_DRIVER_RESTART_BACKOFF_MS": "20",
    "AGENT_DRIVER_RESTART_BACKOFF_CAP_MS": "100",
}


async def run(cp: Any, run_id: str, text: str, timeout: float = 30) -> dict[str, Any]:
    cid, _ = await cp.send_command(INSTANCE, "input.start", run_id=run_id, input={"text": text})
    status: dict[str, Any] = await cp.wait_for_command_status(cid, timeout=timeout)
    return status


def skill_entry(tmp: Path) -> dict[str, Any]:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("SKILL.md", "---\nname: tide-tables\ndescription: Computes tide tables.\n---\n")
    data = buf.getvalue()
    archive = tmp / "tide.zip"
    archive.write_bytes(data)
    return {
        "name": "tide-tables",
        "archive_url": archive.as_uri(),
        "sha256": hashlib.sha256(data).hexdigest(),
        "mount_path": ".skills/tide",
    }


async def test_skill_md_replaced_by_a_fifo_does_not_freeze_the_driver(tmp_path: Path, drivers: list[Driver]) -> None:
    """The driver reads each installed skill's SKILL.md (its front matter names the skill to the
    provider) at every provider start. A fifo there held the driver's event loop in `open()` for
    good: no heartbeat, no command answered (the CP closed the link 4408)."""
    async with control_plane(tmp_path) as cp:
        payload = boot_payload(tmp_path, cp.url)
        payload["execution"]["skills"] = [skill_entry(tmp_path)]
        d = Driver(tmp_path, payload, env=FAST)
        drivers.append(d)
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=20)
        await wait_provider(d)
        script = "cd .skills/tide && rm SKILL.md && mkfifo SKILL.md && kill -9 $PPID"
        first = await run(cp, "run-1", f"[[own-shell:{script}]]")
        assert first["status"] == "failed"  # the run the kill interrupted
        assert (tmp_path / "cwd" / ".skills" / "tide" / "SKILL.md").is_fifo()
        await wait_diagnostic(cp, "provider.restarted")
        assert (await run(cp, "run-2", "[[say:still here]]"))["status"] == "completed"
        assert d.proc.poll() is None
