"""PROTOCOL §5 through the real driver process and every REAL runtime: a run cancelled while its tool
has written files and left a child running says so in `run.cancelled` (`tool_calls`, and
`side_effects{files_changed, processes_left}`); nothing is rolled back.
"""

from __future__ import annotations

import os
import secrets
import signal
from pathlib import Path

import anyio
import pytest

from tests.integration.harness import INSTANCE, control_plane
from tests.kernel import runtimes
from tests.kernel.runtimes import RUNTIMES, Fakes
from tests.kernel.support import Driver, wait_terminal

pytestmark = pytest.mark.provider


def sleepers(marker: str) -> list[int]:
    """Live processes whose command line is exactly `sleep <marker>`."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
                state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if argv[:2] == [b"sleep", marker.encode()] and state != "Z":
                out.append(int(entry))
    return out


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_cancelled_run_reports_files_and_processes_left(runtime: str, tmp_path: Path, fakes: Fakes) -> None:
    marker = f"{400 + secrets.randbelow(500)}.{secrets.randbelow(1000):03d}"
    script = f"echo a > se-a.txt; echo b > se-b.txt; sleep {marker} & sleep 30"
    cwd = tmp_path / "cwd"
    async with control_plane(tmp_path) as cp:
        payload = runtimes.payload(runtime, tmp_path, cp.url, fakes)
        payload["execution"]["permission_policy"] = "full_access"
        d = Driver(tmp_path, payload)
        try:
            text = f"[[shell:{script}]]"
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": text})
            with anyio.fail_after(60):
                while not ((cwd / "se-b.txt").exists() and sleepers(marker)):  # noqa: ASYNC110 (files, /proc)
                    await anyio.sleep(0.05)
            await cp.send_command(INSTANCE, "turn.cancel", run_id="run-1", reason="test")
            term = await wait_terminal(cp, "run-1", timeout=60)
            assert term["kind"] == "run.cancelled"
            assert (await cp.wait_for_command_status(cid, timeout=30))["status"] == "cancelled"
            payload = term["payload"]
            changed = {f["path"]: f["change"] for f in payload["side_effects"]["files_changed"]}
            assert changed == {"se-a.txt": "created", "se-b.txt": "created"}, changed
            # tool_calls: every tool call the run reported starting, with its last reported status.
            run_events = cp.events(INSTANCE, run_id="run-1")
            started = {e["payload"]["tool_call_id"] for e in run_events if e["kind"] == "tool.started"}
            ended = [e["payload"] for e in run_events if e["kind"] == "tool.completed"]
            completed = {p["tool_call_id"]: p["status"] for p in ended}
            assert {t["tool_call_id"] for t in payload["tool_calls"]} == started
            assert all(t["status"] == completed.get(t["tool_call_id"], "running") for t in payload["tool_calls"])
            left = {p["pid"] for p in payload["side_effects"]["processes_left"] if p["argv0"] == "sleep"}
            alive = set(sleepers(marker))
            # The child the tool left running is named (it is still alive now: nothing kills it after
            # the terminal but the provider's own stop, which this test has not asked for).
            assert alive <= left or not alive, (left, alive)
            if payload["details"]["phase"] == "kill":
                assert payload["side_effects"]["processes_left"] == []
        finally:
            for pid in sleepers(marker):
                os.kill(pid, signal.SIGKILL)
            d.close()
