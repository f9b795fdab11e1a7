"""Run the real driver process against the reference control plane on loopback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from agent_lab.controlplane.server import ControlPlane
from agent_lab.testing import agents

ROOT = Path(__file__).resolve().parents[2]
STUBBORN = agents.STUBBORN
TOKEN = "cp-token-SECRET-4242"
INSTANCE = "drv-it.1"


def boot_payload(
    tmp: Path, url: str, *, mode: str = "normal", acp_command: list[str] | None = None, **session: Any
) -> dict[str, Any]:
    """A payload running our own stubborn ACP agent: a real provider process, fast and model-free.

    `acp_command` runs another ACP agent instead (e.g. the fault suite's flood agent)."""
    sess: dict[str, Any] = {
        "id": "ses-it",
        "agent_id": "agt-it",
        "kind": "cattle",
        "cwd": str(tmp / "cwd"),
        "state_dir": str(tmp / "state"),
        "idle_exit_ms": None,
    }
    sess.update(session)
    (tmp / "cwd").mkdir(exist_ok=True)
    return {
        "protocol": 1,
        "driver_instance_id": INSTANCE,
        "control": {"url": url, "token": TOKEN},
        "session": sess,
        "execution": {
            "revision": "rev-it",
            "runtime": "acp",
            "permission_policy": "supervised",
            "permission_timeout_ms": 60_000,
            "environment": {"FAKE_PROVIDER_KEY": "provider-secret-777"},
            "acp": {"command": acp_command or [sys.executable, str(STUBBORN), mode]},
        },
    }


class DriverProcess:
    def __init__(
        self,
        tmp: Path,
        payload: dict[str, Any],
        name: str = "driver",
        extra_env: dict[str, str] | None = None,
        args: tuple[str, ...] = (),
    ) -> None:
        self.boot = tmp / f"{name}.boot.json"
        self.boot.write_text(json.dumps(payload))
        self.boot.chmod(0o600)
        self.stderr_path = tmp / f"{name}.stderr.log"
        self._stderr = self.stderr_path.open("wb")
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_DRIVER")}
        env["AGENT_DRIVER_PROJECT_ROOT"] = str(ROOT)
        env.update(extra_env or {})  # e.g. AGENT_DRIVER_OUTBOX_MAX_EVENTS for the fault suite
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "driver.cli", "run", "--boot-file", str(self.boot), *args],
            stdout=subprocess.DEVNULL,
            stderr=self._stderr,
            env=env,
            cwd=ROOT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def wait(self, timeout: float = 30.0) -> int:
        with anyio.fail_after(timeout):
            # Popen.wait in a worker thread; abandon_on_cancel lets the timeout fire while it blocks.
            return int(await anyio.to_thread.run_sync(self.proc.wait, abandon_on_cancel=True))

    def stderr(self) -> str:
        self._stderr.flush()
        return self.stderr_path.read_text(errors="replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def close(self) -> None:
        self.kill()
        self._stderr.close()


@asynccontextmanager
async def control_plane(tmp: Path, **kwargs: Any) -> AsyncIterator[ControlPlane]:
    kwargs.setdefault("heartbeat_interval_ms", 500)
    async with ControlPlane(tmp / "cp.sqlite3", tokens={TOKEN: {INSTANCE}}, **kwargs) as cp:
        yield cp


def kinds(events: list[dict[str, Any]]) -> list[str]:
    return [e["kind"] for e in events]
