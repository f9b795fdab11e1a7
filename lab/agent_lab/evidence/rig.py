"""The rig every claim runs on: the reference control plane (SQLite store) with a tap on what it
receives, the fake model endpoints, boot payloads for each real runtime, real `agent-driver run`
processes, and /proc readings. Nothing here judges; collectors gather, `checks` decides.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from agent_lab.testing import codex_acp
from agent_lab.testing.fakes import Fakes

if TYPE_CHECKING:
    from agent_lab.controlplane.server import ControlPlane

TERMINALS = ("run.completed", "run.failed", "run.cancelled")
Event = dict[str, Any]


def project_root() -> Path:
    from driver.kernel.options import project_root as root

    return root()


@dataclass
class Sandbox:
    """Where one driver instance lives: its cwd and state_dir (a pet also has a memory_dir)."""

    root: Path
    instance: str
    kind: str = "cattle"
    memory_dir: Path | None = None

    @property
    def cwd(self) -> Path:
        return self.root / "cwd"

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    def create(self) -> Sandbox:
        self.cwd.mkdir(parents=True, exist_ok=True)
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if self.memory_dir is not None:
            self.memory_dir.mkdir(parents=True, exist_ok=True)
        return self


def payload(
    runtime: str,
    box: Sandbox,
    url: str,
    token: str,
    fakes: Fakes,
    *,
    policy: str = "full_access",
    native_resume: dict[str, str] | None = None,
    recovery_messages: list[dict[str, str]] | None = None,
    native_checkpoint: dict[str, Any] | None = None,
    acp_command: list[str] | None = None,
    acp_env: dict[str, str] | None = None,
    reattach_grace_ms: int = 0,
) -> dict[str, Any]:
    """A boot payload running `runtime` offline against the fake model endpoints. `acp_command`
    replaces codex-acp by another ACP agent (the flood agent of the events claim)."""
    execution: dict[str, Any] = {
        "revision": "rev-evidence",
        "permission_policy": policy,
        "permission_timeout_ms": 60_000,
        "native_resume": native_resume,
        "recovery_messages": recovery_messages or [],
        "native_checkpoint": native_checkpoint,  # PROTOCOL §8.1
        "reattach_grace_ms": reattach_grace_ms,
    }
    if runtime == "claude-agent-sdk":
        execution |= {
            "runtime": runtime,
            "model": "claude-sonnet-4-5",
            "environment": {"ANTHROPIC_BASE_URL": fakes.anthropic.base_url, "ANTHROPIC_API_KEY": "sk-ant-fake-ev-0001"},
        }
    elif runtime == "openai-app-server":
        execution |= {
            "runtime": runtime,
            "model": "gpt-5.5",
            "environment": {"OPENAI_API_KEY": "sk-fake-ev-0001"},
            "provider_options": {"base_url": fakes.responses.base_url, "env_key": "OPENAI_API_KEY"},
        }
    elif runtime == "acp" and acp_command is not None:
        execution |= {"runtime": "acp", "environment": {}, "acp": {"command": acp_command, "env": acp_env or {}}}
    elif runtime == "acp":
        binary = codex_acp.binary(project_root())
        if binary is None:
            raise RuntimeError("codex-acp is not installed under node_modules; run `make setup`")
        home = codex_acp.write_home(box.state_dir / "codex-acp-home", fakes.responses.base_url, "FAKE_OPENAI_API_KEY")
        (box.state_dir / "tmp").mkdir(exist_ok=True)  # codex-acp will not install its helper under /tmp
        execution |= {
            "runtime": "acp",
            "environment": {"FAKE_OPENAI_API_KEY": "sk-fake-ev-0001"},
            "acp": {"command": [str(binary)], "env": {"CODEX_HOME": str(home), "TMPDIR": str(box.state_dir / "tmp")}},
        }
    else:
        raise ValueError(f"unknown runtime {runtime!r}")
    session: dict[str, Any] = {
        "id": f"ses-{box.instance}",
        "agent_id": "agt-evidence",
        "kind": box.kind,
        "cwd": str(box.cwd),
        "state_dir": str(box.state_dir),
        "idle_exit_ms": None,
    }
    if box.memory_dir is not None:
        session["memory_dir"] = str(box.memory_dir)
    return {
        "protocol": 1,
        "driver_instance_id": box.instance,
        "control": {"url": url, "token": token},
        "session": session,
        "execution": execution,
    }


def _die_with_the_rig() -> None:
    """In the child, before exec: SIGKILL when the evidence process dies (a test's timeout SIGKILLs it,
    and no cleanup of ours runs then). The driver is in a session of its own, so nothing else would end
    it; what its providers do when it dies is still the driver's own containment, as measured. The rig
    starts drivers from the event loop's thread, which lives as long as the process."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class DriverProc:
    """A real `agent-driver run` process in a session of its own; its stderr is its log."""

    def __init__(
        self,
        box: Sandbox,
        boot: dict[str, Any],
        name: str = "driver",
        env: dict[str, str] | None = None,
        args: tuple[str, ...] = (),
    ):
        self.boot_file = box.root / f"{name}.boot.json"
        fd = os.open(self.boot_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(boot, f)
        self.log_path = box.root / f"{name}.stderr.log"
        from agent_lab.dev import driver_environment

        environ = {k: v for k, v in driver_environment(os.environ).items() if not k.startswith("AGENT_DRIVER")}
        environ["AGENT_DRIVER_PROJECT_ROOT"] = str(project_root())
        environ.update(env or {})
        with self.log_path.open("ab") as log:
            self.spawned_at = time.perf_counter()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "driver.cli", "run", "--boot-file", str(self.boot_file), *args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                env=environ,
                cwd=str(box.cwd),
                start_new_session=True,
                preexec_fn=_die_with_the_rig,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def kill_driver_only(self) -> None:
        """SIGKILL the driver process alone: whether its providers die with it is what is measured."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    async def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM, then SIGKILL of its process group if it lingers; then any descendant left over."""
        tree = descendants(self.proc.pid)
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                with anyio.fail_after(timeout):
                    await anyio.to_thread.run_sync(self.proc.wait, abandon_on_cancel=True)
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        reap(tree)


# -- /proc ---------------------------------------------------------------------------------------------


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    st = _stat(pid)
    return st is not None and st[0] != "Z"


def pgid_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def descendants(pid: int) -> list[int]:
    """Live descendants of `pid` (children, grandchildren, ...), from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None and st[0] != "Z":
                parents.setdefault(int(st[1]), []).append(int(entry))
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return sorted(out)


def proc_info(pid: int) -> dict[str, Any]:
    """argv0, uid and the raw environ/cmdline bytes of a process (None where unreadable)."""
    info: dict[str, Any] = {"pid": pid, "argv0": "", "uid": None, "environ": None, "cmdline": None}
    for name in ("environ", "cmdline"):
        with contextlib.suppress(OSError):
            info[name] = Path(f"/proc/{pid}/{name}").read_bytes()
    if info["cmdline"]:
        info["argv0"] = Path(info["cmdline"].split(b"\0")[0].decode(errors="replace")).name
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                info["uid"] = int(line.split()[1])
    return info


def reap(pids: list[int]) -> None:
    """SIGKILL processes this run started (descendants of its drivers) that are still alive."""
    for pid in pids:
        if alive(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


async def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """Wait (polling /proc: nothing announces a process's end) until none is alive; the survivors."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        await anyio.sleep(0.05)
    return [p for p in pids if alive(p)]


# -- the control plane with a tap ----------------------------------------------------------------------


@dataclass
class Tap:
    """What the control plane received on the wire: every event (even ones it then did not store)
    and when each `hello` arrived."""

    received: list[Event] = field(default_factory=list)
    hellos: list[tuple[float, int]] = field(default_factory=list)  # (perf_counter, epoch)

    def for_instance(self, instance: str) -> list[Event]:
        prefix = f"{instance}/"
        return [e for e in self.received if str(e["event_id"]).startswith(prefix)]


@dataclass
class Rig:
    cp: ControlPlane
    tap: Tap
    token: str
    fakes: Fakes
    root: Path
    drivers: list[DriverProc] = field(default_factory=list)

    def sandbox(self, instance: str, kind: str = "cattle", memory_dir: Path | None = None) -> Sandbox:
        return Sandbox(self.root / instance, instance, kind, memory_dir).create()

    def start(
        self, runtime: str, box: Sandbox, name: str = "driver", env: dict[str, str] | None = None, **kw: Any
    ) -> DriverProc:
        boot = payload(runtime, box, self.cp.url, self.token, self.fakes, **kw)
        d = DriverProc(box, boot, name, env)
        self.drivers.append(d)
        return d

    async def started(self, instance: str, epoch: int = 1, timeout: float = 120.0) -> Event:
        return await self.cp.wait_for_event(
            instance, lambda e: e["kind"] == "driver.started" and e["epoch"] == epoch, timeout=timeout
        )

    async def turn(self, instance: str, run_id: str, text: str, timeout: float = 90.0) -> Event:
        """Send `input.start` and wait for the run's terminal event to be stored."""
        await self.cp.send_command(instance, "input.start", run_id=run_id, input={"text": text})
        return await self.terminal(instance, run_id, timeout)

    async def terminal(self, instance: str, run_id: str, timeout: float = 90.0) -> Event:
        return await self.cp.wait_for_event(instance, is_terminal(run_id), timeout=timeout)

    async def event(self, instance: str, pred: Callable[[Event], bool], timeout: float = 60.0) -> Event:
        return await self.cp.wait_for_event(instance, pred, timeout=timeout)

    async def settle(self, instance: str, timeout: float = 30.0) -> bool:
        """Wait for a heartbeat saying the driver's outbox is empty (every lossless event it admitted
        has its receipt): only then is "received but not stored" a loss rather than a retry on its
        way. False when it did not drain within `timeout` (the accounting then shows what is missing)."""
        try:
            await self.cp.wait_for(
                instance,
                lambda i: i["type"] == "heartbeat" and i["outbox"]["lossless_pending"] == 0,
                timeout=timeout,
            )
        except TimeoutError:
            return False
        return True

    async def close(self) -> None:
        for d in self.drivers:
            await d.stop()


def is_terminal(run_id: str) -> Callable[[Event], bool]:
    return lambda e: e["run_id"] == run_id and e["kind"] in TERMINALS


def new_token() -> str:
    return "evidence-ctl-" + secrets.token_hex(16)


@asynccontextmanager
async def rig(root: Path, fakes: Fakes) -> AsyncIterator[Rig]:
    """A reference control plane (its SQLite store under `root`) accepting one fresh token for any
    instance, with a tap on what it decodes; every driver started through the rig is stopped after."""
    import msgspec

    from agent_lab.controlplane.server import ControlPlane
    from driver.protocol.frames import EventsFrame, Hello

    token = new_token()
    tap = Tap()
    async with ControlPlane(root / "cp.sqlite3", tokens={token: None}, heartbeat_interval_ms=500) as cp:
        decode = cp._decode

        def tapped(raw: str | bytes) -> Any:
            frame = decode(raw)
            if isinstance(frame, Hello):
                tap.hellos.append((time.perf_counter(), frame.epoch))
            elif isinstance(frame, EventsFrame):
                for ev in frame.events:
                    with contextlib.suppress(msgspec.DecodeError):
                        e = msgspec.json.decode(bytes(ev))
                        if isinstance(e, dict):
                            e.pop("payload", None)
                            e["received_at"] = time.perf_counter()
                            tap.received.append(e)
            return frame

        cp._decode = tapped  # type: ignore[method-assign]
        r = Rig(cp, tap, token, fakes, root)
        try:
            yield r
        finally:
            await r.close()
