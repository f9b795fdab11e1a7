"""No write of the driver's in a folder the agent can write follows a link, and what it reads there is
known (issue 30, PROTOCOL §9 "What the agent can write is input").

The REAL driver runs the REAL Codex runtime through a turn whose shell tool writes into `cwd`, then a
provider restart (CODEX_HOME written again), under an audit hook (`sys.addaudithook`, installed by
tests/helpers/audit_site/sitecustomize.py in the driver process only) that records every file open,
rename, link, mkdir and removal. Of those in the agent's folders (`cwd`, `state_dir/providers/`):
- every open for writing is relative to a directory descriptor (driver.agent_files, driver.ports.fetch)
  and carries O_CREAT|O_EXCL|O_NOFOLLOW: a fresh name, then a rename; none names an absolute path there;
- every read there by absolute path is one of the known, bounded reads listed below.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import INSTANCE, ROOT, control_plane
from tests.kernel import runtimes
from tests.kernel.runtimes import Fakes
from tests.kernel.support import Driver, wait_diagnostic, wait_provider

AUDIT_SITE = ROOT / "tests" / "helpers" / "audit_site"
FAST = {"AGENT_DRIVER_RESTART_BACKOFF_MS": "20", "AGENT_DRIVER_RESTART_BACKOFF_CAP_MS": "100"}
WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
SAFE_CREATE = os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW


def records(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def flags_of(record: dict[str, Any]) -> int:
    args = record["args"]
    return int(args[2]) if len(args) > 2 and isinstance(args[2], int) else 0


@pytest.mark.provider
async def test_writes_in_agent_folders_never_follow_links_and_reads_there_are_known(
    tmp_path: Path, drivers: list[Driver], fakes: Fakes
) -> None:
    log = tmp_path / "audit.jsonl"
    cwd, providers = tmp_path / "cwd", tmp_path / "state" / "providers"
    async with control_plane(tmp_path) as cp:
        payload = runtimes.payload("openai-app-server", tmp_path, cp.url, fakes)
        payload["execution"]["permission_policy"] = "full_access"
        env = {**FAST, "DRIVER_AUDIT_LOG": str(log), "PYTHONPATH": str(AUDIT_SITE)}
        d = Driver(tmp_path, payload, env=env)
        drivers.append(d)
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=60)
        pgid = await wait_provider(d)
        text = "[[shell:mkdir -p outputs; echo hi > outputs/a.txt]]"
        cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": text})
        assert (await cp.wait_for_command_status(cid, timeout=60))["status"] == "completed"
        os.killpg(pgid, signal.SIGKILL)  # the agent kills its provider: CODEX_HOME is written again
        exited = await wait_diagnostic(cp, "provider.exited", timeout=30)
        await wait_diagnostic(cp, "provider.restarted", after_seq=exited["seq"], timeout=60)

    agent_roots = (str(cwd.resolve()), str(providers.resolve()))

    def in_agent_folder(path: object) -> bool:
        return isinstance(path, str) and os.path.isabs(path) and os.path.realpath(path).startswith(agent_roots)

    seen = records(log)
    assert any(r["event"] == "open" for r in seen), "the audit hook recorded nothing: the test saw nothing"
    opens = [r for r in seen if r["event"] == "open" and isinstance(r["args"][0], str)]
    # Writes by absolute path into the agent's folders: none.
    unsafe_writes = [r for r in opens if in_agent_folder(r["args"][0]) and flags_of(r) & WRITE]
    assert unsafe_writes == []
    # Writes relative to a directory descriptor: always a fresh name, never through a link.
    relative_writes = [r for r in opens if not os.path.isabs(r["args"][0]) and flags_of(r) & WRITE]
    assert relative_writes, "no safe write was seen (the CODEX_HOME config is one)"
    assert [r for r in relative_writes if flags_of(r) & SAFE_CREATE != SAFE_CREATE] == []
    # The config.toml of CODEX_HOME was written as a fresh temporary name, twice (start and restart).
    assert sum(r["args"][0].startswith(".config.toml.") for r in relative_writes) >= 2
    # Opens by absolute path in the agent's folders: only folder descriptors (the trusted start of a
    # walk, nothing read) and the known, bounded reads.
    reads = sorted(
        {
            os.path.relpath(r["args"][0], tmp_path)
            for r in opens
            if in_agent_folder(r["args"][0]) and not flags_of(r) & os.O_DIRECTORY
        }
    )
    assert [p for p in reads if p not in KNOWN_READS] == []
    # Renames and links there are made relative to a folder's descriptor too (or set something aside).
    moved = [r for r in seen if r["event"] in ("os.rename", "os.symlink") and in_agent_folder(r["args"][1])]
    assert [r for r in moved if ".set-aside-" not in str(r["args"][1])] == []


# The reads the driver makes in the agent's folders by absolute path in this scenario (none today:
# CODEX_HOME's config is written, never read back; a new one is added here with its bound).
KNOWN_READS: frozenset[str] = frozenset()
