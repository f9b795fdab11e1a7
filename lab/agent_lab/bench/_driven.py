"""What the benches that drive a real driver process per runtime share (steer, cancel_evidence), built on
the evidence rig (reference control plane, fakes, Sandbox, boot payloads, DriverProc) so they run from
an install of the lab, not only from a checkout.

The settings are those the kernel tests' payloads use (tests/kernel/runtimes.py): the supervised
permission policy, and runtimes named as the benches print them ("acp:codex-acp", "acp:stubborn").
"""

from __future__ import annotations

import sys
from pathlib import Path

import anyio

from agent_lab.evidence.rig import DriverProc, Rig
from agent_lab.testing.agents import STUBBORN

RUNTIMES = ("claude-agent-sdk", "openai-app-server", "acp:codex-acp")
INSTANCE = "drv-bench.1"
# A prompt that makes each runtime's fake model stream for ~20 s.
SLOW = "[[slow]]"


def start(rig: Rig, runtime: str, *, mode: str = "normal", env: dict[str, str] | None = None) -> DriverProc:
    """A real driver for `runtime` (one of RUNTIMES, or "acp:stubborn" with the stubborn agent's `mode`),
    in a fresh sandbox of `rig`, which stops it when it closes."""
    box = rig.sandbox(INSTANCE)
    if runtime == "acp:codex-acp":
        return rig.start("acp", box, env=env, policy="supervised")
    if runtime == "acp:stubborn":
        command = [sys.executable, str(STUBBORN), mode]
        return rig.start("acp", box, env=env, policy="supervised", acp_command=command)
    if runtime in RUNTIMES:
        return rig.start(runtime, box, env=env, policy="supervised")
    raise ValueError(f"unknown runtime {runtime!r}; choose from {', '.join((*RUNTIMES, 'acp:stubborn'))}")


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the parenthesised command name: state, ppid, pgrp, ..."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def provider_groups(pid: int) -> list[int]:
    """Live direct children of `pid` that lead their own process group: a provider does; short-lived
    helpers the driver runs (its containment probe) stay in the driver's group and are not providers."""
    out: list[int] = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            st = _stat(int(entry.name))
            if st is not None and st[0] != "Z" and int(st[1]) == pid and int(st[2]) == int(entry.name):
                out.append(int(entry.name))
    return sorted(out)


async def provider_pid(driver: DriverProc, timeout: float = 60.0) -> int:
    """The pid (= process group) of the driver's provider, once it runs."""
    with anyio.fail_after(timeout):
        while True:
            found = provider_groups(driver.pid)
            if found:
                return found[0]
            await anyio.sleep(0.02)  # polling /proc: nothing announces a new child
