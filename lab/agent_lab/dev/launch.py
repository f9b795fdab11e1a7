"""The dev session's driver: its one-time boot payload and the `agent-driver run` subprocess."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agent_lab.dev.common import KILL_GRACE_S, PERMISSION_TIMEOUT_MS, PROVIDER_SECRETS, DevPaths
from agent_lab.dev.provider import ProviderSetup


def boot_payload(
    paths: DevPaths, control_url: str, token: str, runtime: str, provider: ProviderSetup
) -> dict[str, Any]:
    """A pet session with no idle exit: the driver must not leave while the user is typing."""
    execution: dict[str, Any] = {
        "revision": "rev-dev",
        "runtime": runtime,
        "model": provider.model,
        "permission_policy": "supervised",
        "permission_timeout_ms": PERMISSION_TIMEOUT_MS,
        "environment": provider.environment,
        "provider_options": provider.provider_options,
    }
    if provider.acp is not None:
        execution["acp"] = provider.acp
    return {
        "protocol": 1,
        "driver_instance_id": paths.instance_id,
        "control": {"url": control_url, "token": token},
        "session": {
            "id": "ses-" + paths.instance_id.removeprefix("drv-"),
            "agent_id": "agt-dev",
            "kind": "pet",
            "cwd": str(paths.workspace),
            "state_dir": str(paths.state_dir),
            "memory_dir": str(paths.memory),
            "idle_exit_ms": None,
        },
        "execution": execution,
    }


def write_boot_file(path: Path, payload: Mapping[str, Any]) -> None:
    """Create the file with mode 0600 from the start (never a moment readable by others)."""
    from driver.protocol.boot import BOOT_DECODER

    data = json.dumps(payload).encode()
    BOOT_DECODER.decode(data)  # a mistake here should fail in dev, with a traceback, not in the driver
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def driver_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The driver's own environment: ours minus boot-file/token variables and provider credentials."""
    from driver.adapters.common.environment import FORBIDDEN

    return {k: v for k, v in env.items() if k not in FORBIDDEN and k not in PROVIDER_SECRETS}


async def launch_driver(paths: DevPaths, env: Mapping[str, str]) -> asyncio.subprocess.Process:
    """`agent-driver run` as a real process, in a session of its own so the terminal's Ctrl-C reaches
    only this chat (which turns it into a command), never the driver."""
    with paths.driver_log.open("ab") as log:
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "driver.cli",
            "run",
            "--boot-file",
            str(paths.boot_file),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=driver_environment(env),
            cwd=str(paths.workspace),
            start_new_session=True,
        )


async def end_process(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM the driver's process group, SIGKILL it if it lingers."""
    for sig, grace in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, KILL_GRACE_S)):
        if proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), grace)


def log_tail(path: Path, lines: int = 12) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []
