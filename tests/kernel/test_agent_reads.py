"""What the driver reads in the agent's folders is bounded and never blocks it (issue 30 follow-up,
PROTOCOL §9 "What the agent can write is input", THREATS.md items 3 and 4).

Through the REAL driver process and our stubborn ACP agent, whose `[[own-shell:]]` tool runs a command
as the agent's own child (inside the provider tree): the agent reshapes a file the driver reads at the
next provider start, then kills its provider, so the driver's restart path meets it.
"""

from __future__ import annotations

import hashlib
import http.server
import io
import os
import signal
import threading
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import INSTANCE, boot_payload, control_plane
from tests.kernel import runtimes
from tests.kernel.runtimes import Fakes
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


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


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


class _HeldDownload:
    """An HTTP server on loopback whose one file is served only once `until()` holds (bounded): the
    second attachment of a run, still downloading while the agent reshapes the first one (a large
    attachment gives the agent the same window)."""

    def __init__(self, body: bytes, until: Callable[[], bool]) -> None:
        held = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                deadline = time.monotonic() + 20
                while not until() and time.monotonic() < deadline:
                    held.waits += 1
                    time.sleep(0.01)
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.waits = 0
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/b.bin"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> _HeldDownload:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


async def test_attachment_replaced_by_a_fifo_before_the_turn_does_not_freeze_the_driver(
    tmp_path: Path, drivers: list[Driver]
) -> None:
    """A text attachment is read by the driver to hand it to the runtime natively. The agent's
    background process (left by an earlier run) turns `inputs/a.txt` into a fifo as soon as the
    driver has downloaded it, while the run's second attachment still downloads: a plain `stat` +
    `read_bytes` then held the driver's event loop in `open()` for good."""
    a_txt = tmp_path / "a.txt"
    a_txt.write_bytes(b"first attachment")
    b_body = b"second attachment"
    fifo = tmp_path / "cwd" / "inputs" / "a.txt"
    async with control_plane(tmp_path) as cp:
        payload = boot_payload(tmp_path, cp.url)
        d = Driver(tmp_path, payload, env=FAST)
        drivers.append(d)
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=20)
        watcher = (
            "nohup sh -c 'i=0; while [ ! -f inputs/a.txt ] && [ $i -lt 3000 ]; do sleep 0.01; i=$((i+1)); done;"
            " rm -f inputs/a.txt; mkfifo inputs/a.txt' >/dev/null 2>&1 &"
        )
        assert (await run(cp, "run-1", f"[[own-shell:{watcher}]]"))["status"] == "completed"
        with _HeldDownload(b_body, until=fifo.is_fifo) as held:
            attachments = [
                {"name": "a.txt", "url": a_txt.as_uri(), "sha256": sha(a_txt.read_bytes()), "size": 16},
                {"name": "b.bin", "url": held.url, "sha256": sha(b_body), "size": len(b_body)},
            ]
            cid, _ = await cp.send_command(
                INSTANCE, "input.start", run_id="run-2", input={"text": "[[say:read]]", "attachments": attachments}
            )
            status = await cp.wait_for_command_status(cid, timeout=30)
            # The agent won its race, as a real one would: the second download is held until the swap
            # (or the swap came first, before the download was asked for), so the turn's read met the fifo.
            assert fifo.is_fifo()
        assert status["status"] == "completed"
        assert (await run(cp, "run-3", "[[say:still here]]"))["status"] == "completed"
        assert d.proc.poll() is None


@pytest.mark.provider
async def test_claude_skills_folder_replaced_by_a_file_does_not_brick_the_provider(
    tmp_path: Path, drivers: list[Driver], fakes: Fakes
) -> None:
    """With skills, the driver links them into the Claude CLI's `CLAUDE_CONFIG_DIR/skills` at every
    CLI start. The CLI's own Bash tool (the agent) makes that folder a file and its CLI is killed: the
    walk refused the file (no link followed) but nothing set it aside, so every later start of the
    CLI failed, on this driver and on every later one on the same state_dir."""
    skills = tmp_path / "state" / "providers" / "claude-agent-sdk" / "claude-config" / "skills"
    async with control_plane(tmp_path) as cp:
        payload = runtimes.payload("claude-agent-sdk", tmp_path, cp.url, fakes)
        payload["execution"]["permission_policy"] = "full_access"
        payload["execution"]["skills"] = [skill_entry(tmp_path)]
        d = Driver(tmp_path, payload, env=FAST)
        drivers.append(d)
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=60)
        pgid = await wait_provider(d)
        assert skills.is_dir()
        assert (await run(cp, "run-1", f"[[shell:rm -rf {skills} && printf planted > {skills}]]", 60))[
            "status"
        ] == "completed"
        assert skills.is_file(), "the agent's tool could not replace the folder: the attack did not run"
        os.killpg(pgid, signal.SIGKILL)
        exited = await wait_diagnostic(cp, "provider.exited", timeout=30)
        await wait_diagnostic(cp, "provider.restarted", after_seq=exited["seq"], timeout=60)
        assert (await run(cp, "run-2", "[[say:fine]]", 60))["status"] == "completed"
        assert skills.is_dir() and d.proc.poll() is None


async def test_a_process_start_after_the_agent_made_its_home_a_file_starts(
    tmp_path: Path, drivers: list[Driver]
) -> None:
    """§6.8 processes get the provider's `$HOME` (`state_dir/providers/<runtime>/home`), made at each
    `process.start` with a plain `mkdir(exist_ok=True)`: a file the agent left there (its provider
    still running, so no restart set it aside) failed every `process.start` with an internal error."""
    home = tmp_path / "state" / "providers" / "acp" / "home"
    async with control_plane(tmp_path) as cp:
        d = Driver(tmp_path, boot_payload(tmp_path, cp.url), env=FAST)
        drivers.append(d)
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=20)
        script = 'rm -rf "$HOME" && printf planted > "$HOME"'
        assert (await run(cp, "run-1", f"[[own-shell:{script}]]"))["status"] == "completed"
        assert home.is_file()
        cid, _ = await cp.send_command(INSTANCE, "process.start", process_id="p1", argv=["sh", "-c", "echo $HOME"])
        status = await cp.wait_for_command_status(cid, timeout=30)
        assert status["status"] == "completed", status
        assert home.is_dir() and d.proc.poll() is None
        aside = await wait_diagnostic(cp, "provider.home_set_aside")
        assert aside["payload"]["details"]["set_aside_as"].startswith("home.set-aside-")


@pytest.mark.provider
async def test_claude_config_dir_replaced_by_a_file_does_not_brick_the_provider(
    tmp_path: Path, drivers: list[Driver], fakes: Fakes
) -> None:
    """The Claude CLI's `CLAUDE_CONFIG_DIR` is the driver's choice (`claude-config` under the provider's
    folder) and the agent's to write; with skills the driver links them into its `skills/` at every
    CLI start. The CLI's Bash tool makes the config folder a file and the CLI is killed: the driver's
    `mkdir` of it raised at every later start of the CLI (on this driver and any later one on the
    same state_dir). It is set aside as the provider's home is."""
    config_dir = tmp_path / "state" / "providers" / "claude-agent-sdk" / "claude-config"
    async with control_plane(tmp_path) as cp:
        payload = runtimes.payload("claude-agent-sdk", tmp_path, cp.url, fakes)
        payload["execution"]["permission_policy"] = "full_access"
        payload["execution"]["skills"] = [skill_entry(tmp_path)]
        d = Driver(tmp_path, payload, env=FAST)
        drivers.append(d)
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=60)
        pgid = await wait_provider(d)
        assert config_dir.is_dir()
        script = f"rm -rf {config_dir} && printf planted > {config_dir}"
        await run(cp, "run-1", f"[[shell:{script}]]", 60)  # whatever the CLI makes of it afterwards
        assert config_dir.is_file(), "the agent's tool could not replace the folder: the attack did not run"
        os.killpg(pgid, signal.SIGKILL)
        exited = await wait_diagnostic(cp, "provider.exited", timeout=30)
        await wait_diagnostic(cp, "provider.restarted", after_seq=exited["seq"], timeout=60)
        assert (await run(cp, "run-2", "[[say:fine]]", 60))["status"] == "completed"
        assert config_dir.is_dir() and d.proc.poll() is None
        assert [p.read_text() for p in config_dir.parent.glob("claude-config.set-aside-*")] == ["planted"]
