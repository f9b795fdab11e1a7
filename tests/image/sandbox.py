"""The image, built and run without Docker: what the Dockerfile does, step by step, on this machine.

- `build_wheel`: the sources the Dockerfile copies, built into a wheel (never from the checkout in
  place, so nothing the checkout has by accident, e.g. an egg-info, leaks in).
- `make_venv`: a fresh venv from Debian's own /usr/bin/python3 (not the interpreter running the
  tests), the wheel installed into it non-editable by the test venv's pip (`--python`), with pip's
  cache: the venv needs no pip of its own and dependencies come from the cache, not the network.
- `dockerfile_env`: the final stage's ENV, read from the Dockerfile itself, so the driver starts with
  exactly what the image gives it (`env -i` plus these, plus HOME as `docker run` sets it).
- `ControlPlaneProcess`: the reference control plane started from the installed wheel.
"""

from __future__ import annotations

import os
import pwd
import queue
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
SYSTEM_PYTHON = Path("/usr/bin/python3")
IMAGE_ROOT = "/opt/agent-driver"  # AGENT_DRIVER_PROJECT_ROOT in the image
SANDBOX_UID = 10001
# The checkout's venv (`make setup`), else the one running the tests (a shared venv).
PIP = ROOT / ".venv" / "bin" / "pip"
if not PIP.exists():
    PIP = Path(sys.executable).with_name("pip")
CP_READY = re.compile(r"control plane: (ws://\S+)\s+api: (http://\S+)")


# -- the Dockerfile ---------------------------------------------------------------------------------


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        if pending.strip():
            word, _, rest = pending.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
        pending = ""
    return out


def final_stage(text: str) -> list[tuple[str, str]]:
    instructions = _instructions(text)
    start = max(i for i, (word, _) in enumerate(instructions) if word == "FROM")
    return instructions[start:]


def _pairs(args: str) -> dict[str, str]:
    """KEY=VALUE pairs of an ENV or LABEL instruction (values quoted or bare, no spaces in bare ones)."""
    return {m.group(1): m.group(2) if m.group(2) is not None else m.group(3)
            for m in re.finditer(r'([\w.-]+)=(?:"([^"]*)"|(\S+))', args)}  # fmt: skip


def dockerfile_env(text: str | None = None) -> dict[str, str]:
    env: dict[str, str] = {}
    for word, args in final_stage(text if text is not None else DOCKERFILE.read_text()):
        if word == "ENV":
            env.update(_pairs(args))
    return env


def dockerfile_labels(text: str | None = None) -> dict[str, str]:
    labels: dict[str, str] = {}
    for word, args in final_stage(text if text is not None else DOCKERFILE.read_text()):
        if word == "LABEL":
            labels.update(_pairs(args))
    return labels


def relocate(env: Mapping[str, str], image_root: Path) -> dict[str, str]:
    """The image's environment with /opt/agent-driver replaced by where this machine has it."""
    return {k: v.replace(IMAGE_ROOT, str(image_root)) for k, v in env.items()}


# -- building ----------------------------------------------------------------------------------------


def run(argv: list[str | Path], **kwargs: object) -> subprocess.CompletedProcess[str]:
    """Run to completion; on failure the assertion shows the command's own output."""
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, **kwargs)  # type: ignore[call-overload]
    assert done.returncode == 0, f"{argv[:3]} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done  # type: ignore[no-any-return]


def build_wheel(out: Path) -> Path:
    """The daemon's wheel, from exactly what the Dockerfile copies."""
    src = out / "src"
    src.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md", "LICENSE"):  # what the Dockerfile COPYs
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "driver", src / "driver", ignore=shutil.ignore_patterns("__pycache__"))
    run([PIP, "wheel", "--quiet", "--no-deps", "-w", out / "dist", src])
    (wheel,) = (out / "dist").glob("agent_driver-*.whl")
    return wheel


def build_lab_wheel(out: Path) -> Path:
    """The laboratory's wheel, from a copy of lab/ (never built in place)."""
    src = out / "lab-src"
    shutil.copytree(ROOT / "lab", src, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    run([PIP, "wheel", "--quiet", "--no-deps", "-w", out / "dist", src])
    (wheel,) = (out / "dist").glob("agent_driver_lab-*.whl")
    return wheel


def make_venv(venv: Path, wheel: Path) -> Path:
    assert SYSTEM_PYTHON.exists(), f"{SYSTEM_PYTHON} is missing: the image's Python is Debian's python3"
    run([SYSTEM_PYTHON, "-m", "venv", "--without-pip", venv])
    # With the `telemetry` extra, as the Dockerfile installs it (OTLP export when a payload asks for it).
    run([PIP, "--python", venv / "bin" / "python", "install", "--quiet", f"{wheel}[telemetry]"])
    return venv


def sandbox_user() -> tuple[int, int]:
    """(uid, gid) the driver runs as: uid 10001 as in the image, created when missing (as root); when
    the tests do not run as root, their own uid is already unprivileged."""
    if os.geteuid() != 0:
        return os.getuid(), os.getgid()
    try:
        entry = pwd.getpwuid(SANDBOX_UID)
    except KeyError:
        # A passwd entry matters: Node's os.userInfo() (used by Claude Code) throws without one.
        run(["useradd", "--uid", SANDBOX_UID, "--user-group", "--no-create-home",
             "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", "agent-driver-image"])  # fmt: skip
        entry = pwd.getpwuid(SANDBOX_UID)
    return entry.pw_uid, entry.pw_gid


def runtimes_in(root: Path) -> Path:
    """`root/node_modules`, where the image has the pinned runtimes. This machine has them in the
    checkout, whose parents the sandbox uid may not traverse (a clone under a 0700 home or `mktemp
    -d`): as root, an empty mount point that `private_mount` binds the checkout's node_modules onto
    for the driver alone; otherwise (the driver runs as this uid, which reaches the checkout) a link."""
    target = root / "node_modules"
    if os.geteuid() == 0:
        target.mkdir()
    else:
        target.symlink_to(ROOT / "node_modules")
    return target


def private_mount(target: Path, owner: tuple[int, int]) -> list[str]:
    """A command prefix (as root): a private mount namespace where the checkout's node_modules is
    bound onto `target`, then the command as `owner` with no supplementary groups. Bind mounts do not
    need the source's parents to be traversable by the uid that reads through them."""
    script = 'mount --bind "$1" "$2" && shift 2 && exec "$@"'
    return ["/usr/bin/unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", script, "sh",
            str(ROOT / "node_modules"), str(target),
            "/usr/bin/setpriv", f"--reuid={owner[0]}", f"--regid={owner[1]}", "--clear-groups", "--"]  # fmt: skip


def operator_command() -> tuple[list[str], dict[str, str]]:
    """The operator's side (control plane, boot payloads, client commands) is the laboratory, which the
    image does not carry: run it from this checkout's environment."""
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    if os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return [sys.executable, "-m", "driver.cli"], env


def owned_dir(path: Path, owner: tuple[int, int], mode: int = 0o700) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, *owner)
    path.chmod(mode)
    return path


def chown_tree(path: Path, owner: tuple[int, int]) -> None:
    for folder, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            os.chown(os.path.join(folder, name), *owner)
    os.chown(path, *owner)


# -- processes ---------------------------------------------------------------------------------------


class LineReader:
    """Drains a process's output in a thread (a full pipe would block it) and lets a test wait for a
    line with a timeout."""

    def __init__(self, stream: object) -> None:
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            self.lines.append(line)
            self._queue.put(line)
        self._queue.put(None)

    def wait_for(self, pattern: re.Pattern[str], timeout: float) -> re.Match[str]:
        """The first line so far that matches, in any order with other waits (two processes sharing
        one terminal print their ready lines in whichever order they get there)."""
        deadline = time.monotonic() + timeout
        checked = 0
        while True:
            seen = len(self.lines)
            for line in self.lines[checked:seen]:
                found = pattern.search(line)
                if found:
                    return found
            checked = seen
            # A new line (or the end) wakes us; the lines themselves are read from `self.lines`.
            ended = self._queue.get(timeout=max(0.0, deadline - time.monotonic())) is None
            if ended and checked == len(self.lines):
                raise AssertionError(
                    "the process ended before printing " + pattern.pattern + "\n" + "".join(self.lines)
                )


@dataclass
class ControlPlaneProcess:
    proc: subprocess.Popen[str]
    output: LineReader
    url: str
    api: str
    token_file: Path


@contextmanager
def control_plane(folder: Path) -> Iterator[ControlPlaneProcess]:
    """`agent-driver controlplane` (the laboratory's), on free ports, until the block ends."""
    token_file = folder / "cp.token"
    command, env = operator_command()
    proc = subprocess.Popen(
        [*command, "controlplane", "--db", str(folder / "cp.sqlite3"),
         "--token-file", str(token_file), "--port", "0", "--http-port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    try:
        output = LineReader(proc.stdout)
        ready = output.wait_for(CP_READY, timeout=60)
        yield ControlPlaneProcess(proc, output, ready.group(1), ready.group(2), token_file)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
