"""Provider processes die with their driver (PROTOCOL §8).

Two mechanisms, one per way a driver can end:

- **Dying with the driver.** Every provider (and every ACP terminal command the driver runs for one)
  is started through `wrap()`: by default `bwrap --unshare-pid --die-with-parent --dev-bind / /`, a
  PID namespace whose init is tied to the driver by PR_SET_PDEATHSIG. When the driver dies, however it
  dies, bwrap gets SIGKILL, its init follows, and the kernel kills every process in the namespace,
  including tools that left the provider's process group or session (`setsid`). The file system,
  environment, uid and working directory are the driver's own (`--dev-bind / /`); the provider runs as
  pid 2 under bwrap's init, so a SIGTERM sent to the provider's process group still reaches it (a pid 1
  would ignore it). PDEATHSIG fires when the *thread* that forked the child exits: every spawn happens
  on the event loop's thread (asyncio forks there), never in a worker thread.
  Where namespaces are forbidden, the fallback is `driver/containment/subreaper.py`: a child subreaper holding the
  provider, which gets SIGTERM when the driver dies (PR_SET_PDEATHSIG) and then SIGKILLs its whole
  tree, orphans reparented to it included. `AGENT_DRIVER_CONTAINMENT=pidns|subreaper|pdeathsig|none`
  forces a mode (benchmarks, tests); `pdeathsig` (`setpriv --pdeathsig KILL`) covers the provider only.
- **Cleaning up after a predecessor.** Every process spawned through here is recorded, and what a
  dead predecessor recorded is killed before the next provider starts: `driver.containment.record`, whose
  functions are re-exported here (`track`, `started`, `ended`, `start_time`, the findings).

This module chooses the wrapper (probing what the machine allows, with the hiding mounts of
`driver.containment.hiding`) and signals what it wraps.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from driver import logs

log = logs.get("driver.containment")

ENV_MODE = "AGENT_DRIVER_CONTAINMENT"
MODES = ("auto", "pidns", "subreaper", "pdeathsig", "none")

__all__ = [
    "ENV_MODE",
    "MODES",
    "exit_status",
    "hide",
    "kill_group",
    "mode_of",
    "pdeathsig_prefix",
    "pidns_prefix",
    "prefix",
    "state_visible",
    "subreaper_prefix",
    "take_degraded",
    "wrap",
    "wrap_async",
]

_prefix: list[str] | None = None
_prefix_lock = threading.Lock()
# What the provider tree must not see and what it must (driver.containment.hiding), set by `hide` before the
# first provider starts; the mount plan is made with the prefix, once.
_private: tuple[list[Path], list[Path], list[Path]] = ([], [], [])
_degraded: list[dict[str, Any]] = []
_state_visible = False  # whether a hidden path (state_dir/driver/, the lock) stays visible to the provider


def hide(
    hidden: Iterable[Path | str | None],
    visible: Iterable[Path | str | None],
    scratch: Iterable[Path | str | None] = (),
) -> None:
    """Ask for `hidden` (read-only) and `scratch` (writable) to be covered in the provider's mount
    namespace, `visible` kept (PROTOCOL §9; driver/containment/hiding.py). Called once, before the first
    provider starts (the prefix is chosen then)."""
    global _private
    _private = ([Path(p) for p in hidden if p], [Path(p) for p in visible if p], [Path(p) for p in scratch if p])


def state_visible() -> bool:
    """Whether the driver's own state (`state_dir/driver/`) is visible to the provider tree: the features
    that rely on hiding check this to authenticate or refuse (PROTOCOL §9, per feature). Chosen with the
    prefix: call `prefix()` first."""
    return _state_visible


def degraded_feature(feature: str, action: str, message: str) -> None:
    """Say once, beside `containment.degraded`, how one feature meets a visible state (`refused`)."""
    _degraded.append(
        {
            "code": "containment.degraded",
            "severity": "warning",
            "message": message,
            "details": {"mode": mode_of(_prefix or []), "feature": feature, "action": action},
        }
    )
    log.warning("containment.degraded", feature=feature, action=action)


def take_degraded() -> list[dict[str, Any]]:
    """The `containment.degraded` diagnostics' payloads, once: what is not hidden, and why."""
    out = list(_degraded)
    _degraded.clear()
    return out


def _probe(prefix: list[str]) -> bool:
    # One probe per process (about 4 ms): a container that forbids namespaces makes bwrap fail here.
    try:
        return subprocess.run([*prefix, "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _with_mounts(prefix: list[str]) -> list[str] | None:
    """`prefix` with the hiding mounts before its `--`, probed; reports what stays visible. One probe
    when the mounts work (the usual case); the bare prefix is probed only when they do not."""
    from driver.containment import hiding

    hidden, visible, scratch = _private
    plan = hiding.plan(hidden, visible, scratch) if hidden else hiding.Plan()
    if not plan.args:
        chosen = prefix if _probe(prefix) else None
    else:
        cut = prefix.index("--")
        chosen = [*prefix[:cut], *plan.args, *prefix[cut:]]
        if not _probe(chosen):
            chosen = prefix if _probe(prefix) else None
            if chosen is not None:  # a PID namespace, but no mounts: keep it, say what is visible
                _report_degraded("bwrap refused the mounts that hide them", "pidns")
    if chosen is not None and plan.not_hidden:
        _report_degraded("some cannot be hidden", "pidns", plan.not_hidden)
    return chosen


def _report_degraded(reason: str, mode: str, items: list[dict[str, str]] | None = None) -> None:
    hidden, _, scratch = _private
    hidden = [*hidden, *scratch]
    if not hidden:
        return  # nothing was asked to be hidden (benchmarks, unit tests): nothing is degraded
    visible = items if items is not None else [{"path": str(p), "reason": reason} for p in hidden]
    global _state_visible
    own = {str(p.resolve(strict=False)) for p in _private[0]}
    _state_visible = _state_visible or items is None or any(i["path"] in own for i in visible)
    _degraded.append(
        {
            "code": "containment.degraded",
            "severity": "warning",
            "message": f"the provider's tools can see some of the driver's files ({reason}); journal rows "
            "stay authenticated and the ports still refuse them",
            "details": {"mode": mode, "visible": visible},
        }
    )
    log.warning("containment.degraded", reason=reason, mode=mode, visible=[i["path"] for i in visible])


def pidns_prefix() -> list[str] | None:
    bwrap = shutil.which("bwrap")
    env = shutil.which("env")
    if bwrap is None or env is None:
        return None
    # bwrap itself ignores SIGTERM (`env --ignore-signal`; env execs in place, so bwrap's parent is
    # still the driver): were it to die of the SIGTERM sent to the provider's group, its PDEATHSIG
    # would SIGKILL the provider at once and the grace period of a cancel would mean nothing.
    # pid 1 of the namespace is a shell (`--as-pid-1`), bwrap's direct child, which bwrap reaps (with
    # bwrap's own init, bwrap exits before its init is reaped and leaves a zombie to the machine's
    # pid 1). As pid 1 the shell ignores SIGTERM; it runs the provider as pid 2 with SIGTERM's default
    # back and the real stdin (fd 3: an asynchronous command's stdin would be /dev/null), waits for it
    # and exits with its status, which ends the namespace and everything in it.
    prefix = [
        env,
        "--ignore-signal=TERM",
        bwrap,
        "--unshare-pid",
        "--die-with-parent",
        "--as-pid-1",
        "--dev-bind",
        "/",
        "/",
        # A /proc of the new PID namespace: tools that read /proc/<pid> with pids they see (codex's
        # own bwrap sandbox opens /proc/<pid>/ns/*) must find their own processes there.
        "--proc",
        "/proc",
        "--",
        "/bin/sh",
        "-c",
        f'exec 3<&0; {shlex.quote(env)} --default-signal=TERM "$@" <&3 3<&- & wait $!',
        "sh",
    ]
    return _with_mounts(prefix)


def subreaper_prefix() -> list[str]:
    # `-I`: the helper needs only the standard library, and nothing from the environment.
    import sys

    return [sys.executable, "-I", str(Path(__file__).with_name("subreaper.py")), str(os.getpid())]


def pdeathsig_prefix() -> list[str] | None:
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--"] if setpriv else None


def prefix() -> list[str]:
    """The argv prefix every provider process is started with (chosen once per process)."""
    global _prefix
    with _prefix_lock:
        if _prefix is None:
            mode = os.environ.get(ENV_MODE, "auto")
            if mode not in MODES:
                raise ValueError(f"{ENV_MODE} must be one of {', '.join(MODES)}, not {mode!r}")
            chosen: list[str] | None = None
            if mode in ("auto", "pidns"):
                chosen = pidns_prefix()
            if chosen is None and mode in ("auto", "subreaper"):
                chosen = subreaper_prefix()
            if chosen is None and mode == "pdeathsig":
                chosen = pdeathsig_prefix()
            _prefix = chosen or []
            if mode_of(_prefix) != "pidns":
                _report_degraded("no mount namespace is allowed here", mode_of(_prefix))
            log.info("containment.mode", mode=mode_of(_prefix))
        return list(_prefix)


def mode_of(argv_prefix: list[str]) -> str:
    if not argv_prefix:
        return "none"
    if "--unshare-pid" in argv_prefix:
        return "pidns"
    return "subreaper" if argv_prefix[-2].endswith("subreaper.py") else "pdeathsig"


def wrap(argv: list[str]) -> list[str]:
    return [*prefix(), *argv]


async def wrap_async(argv: list[str]) -> list[str]:
    """`wrap`, with the one-time probe (a few ms) in a worker thread instead of on the event loop.
    Only the probe runs there: the provider itself is spawned by the caller, on the loop's thread."""
    import anyio.to_thread

    return [*(await anyio.to_thread.run_sync(prefix)), *argv]


def kill_group(pgid: int, sig: int) -> bool:
    """`killpg`, except that SIGKILL for a group led by the PID-namespace wrapper goes to the
    namespace's pid 1 only: the kernel then kills everything in the namespace, and bwrap reaps its
    child and exits by itself. Killing bwrap at the same time could orphan pid 1 before it is reaped
    (a zombie left to the machine's init, or to the driver when the driver is pid 1).
    Returns whether the group existed; PermissionError propagates (the caller reports it)."""
    mode = mode_of(_prefix) if _prefix else "none"
    if sig == signal.SIGKILL and mode == "pidns":
        inner = _children(pgid)
        if inner:
            for pid in inner:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            return True
    if sig == signal.SIGKILL and mode == "subreaper":
        # What left the group (setsid tools) was reparented to the subreaper: reach it by the tree.
        for pid in _descendants(pgid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def _descendants(pid: int) -> list[int]:
    out: list[int] = []
    todo = [pid]
    while todo:
        kids = _children(todo.pop())
        out.extend(kids)
        todo.extend(kids)
    return out


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def exit_status(code: int | None) -> int | None:
    """A wrapped process's exit status as if it were not wrapped. bwrap reports a command killed by
    signal N as 128+N; we report it as -N, like subprocess does (an exit(128+N) reads the same)."""
    if code is not None and code > 128 and _prefix and mode_of(_prefix) in ("pidns", "subreaper"):
        return -(code - 128)
    return code
