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
  Where namespaces are forbidden, the fallback is `driver/subreaper.py`: a child subreaper holding the
  provider, which gets SIGTERM when the driver dies (PR_SET_PDEATHSIG) and then SIGKILLs its whole
  tree, orphans reparented to it included. `AGENT_DRIVER_CONTAINMENT=pidns|subreaper|pdeathsig|none`
  forces a mode (benchmarks, tests); `pdeathsig` (`setpriv --pdeathsig KILL`) covers the provider only.
- **Cleaning up after a predecessor.** The pid, process group and start time (field 22 of
  `/proc/<pid>/stat`) of every process spawned through here are recorded in
  `state_dir/driver/processes.json`. A new driver process, holding the `state_dir` lock, kills what
  is recorded there before it starts its own provider: a leader only when its start time still
  matches (so a reused pid is never signalled), and members of a recorded group whose leader is gone
  only when they started after it.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import shlex
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec

from driver import logs
from driver.queue.journal_rows import Finding
from driver.queue.rowmac import UNKEYED, RowMac

log = logs.get("driver.containment")

ENV_MODE = "AGENT_DRIVER_CONTAINMENT"
MODES = ("auto", "pidns", "subreaper", "pdeathsig", "none")
RECORD_NAME = "processes.json"

_prefix: list[str] | None = None
_prefix_lock = threading.Lock()
_record: ProcessRecord | None = None
# What the provider tree must not see and what it must (driver.hiding), set by `hide` before the
# first provider starts; the mount plan is made with the prefix, once.
_private: tuple[list[Path], list[Path], list[Path]] = ([], [], [])
_degraded: list[dict[str, Any]] = []


def hide(
    hidden: Iterable[Path | str | None],
    visible: Iterable[Path | str | None],
    scratch: Iterable[Path | str | None] = (),
) -> None:
    """Ask for `hidden` (read-only) and `scratch` (writable) to be covered in the provider's mount
    namespace, `visible` kept (PROTOCOL §9; driver/hiding.py). Called once, before the first
    provider starts (the prefix is chosen then)."""
    global _private
    _private = ([Path(p) for p in hidden if p], [Path(p) for p in visible if p], [Path(p) for p in scratch if p])


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
    from driver import hiding

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

_findings: list[Finding] = []


def _pidns_prefix() -> list[str] | None:
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


def _subreaper_prefix() -> list[str]:
    # `-I`: the helper needs only the standard library, and nothing from the environment.
    import sys

    return [sys.executable, "-I", str(Path(__file__).with_name("subreaper.py")), str(os.getpid())]


def _pdeathsig_prefix() -> list[str] | None:
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
                chosen = _pidns_prefix()
            if chosen is None and mode in ("auto", "subreaper"):
                chosen = _subreaper_prefix()
            if chosen is None and mode == "pdeathsig":
                chosen = _pdeathsig_prefix()
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


# -- the record of what this driver process started ---------------------------------------------------


def start_time(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (clock ticks after boot): with the pid, a process's identity
    (a zombie's too: a reused pid stays recognisable while its new owner awaits reaping)."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def _zombie(pid: int) -> bool:
    fields = _stat_fields(pid)
    return fields is not None and fields[0] == "Z"


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: the fields start after the last ')'.
    return raw[raw.rfind(b")") + 2 :].decode().split()


class ProcessRecord:
    """`state_dir/driver/processes.json`: {"entries": [{pid, pgid, start}], "mac": hex} of the processes
    still running. The MAC (HMAC-SHA256 under the journal's key, driver/queue/rowmac.py) is checked
    before any signal: a file the driver did not write (an agent naming any same-uid process group,
    or a list from a driver before MACs) makes the next process signal nothing and report it."""

    def __init__(self, state_dir: Path, mac: RowMac | None = None) -> None:
        self.path = state_dir / "driver" / RECORD_NAME
        self.mac = mac or UNKEYED
        self._entries: dict[int, dict[str, int]] = {}

    def add(self, pid: int) -> None:
        start = start_time(pid)
        if start is None:
            return  # already gone: nothing to clean up later
        fields = _stat_fields(pid)
        pgid = int(fields[2]) if fields else pid
        self._entries[pid] = {"pid": pid, "pgid": pgid, "start": start}
        self._write()

    def remove(self, pid: int) -> None:
        if self._entries.pop(pid, None) is not None:
            self._write()

    def _mac_of(self, entries: bytes) -> str:
        return self.mac.of("processes", entries).hex()

    def _write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = self.path.with_suffix(".tmp")
        entries = msgspec.json.encode(list(self._entries.values()))
        tmp.write_bytes(b'{"entries":' + entries + b',"mac":"' + self._mac_of(entries).encode() + b'"}')
        tmp.replace(self.path)

    def read(self) -> list[dict[str, int]]:
        """The entries, only when the file is the driver's own; else [] (and a finding)."""
        try:
            raw = self.path.read_bytes()
        except OSError:
            return []
        try:
            data = msgspec.json.decode(raw)
        except msgspec.DecodeError:
            data = None
        entries = data.get("entries") if isinstance(data, dict) else None
        mac = data.get("mac") if isinstance(data, dict) else None
        if (
            not isinstance(entries, list)
            or not isinstance(mac, str)
            or not hmac.compare_digest(mac, self._mac_of(msgspec.json.encode(entries)))
        ):
            _findings.append(Finding("processes", RECORD_NAME, "mac"))
            log.error("containment.record_tampered", path=str(self.path))
            return []
        return [
            e
            for e in entries
            if isinstance(e, dict)
            and {"pid", "pgid", "start"} <= e.keys()
            and all(type(e[k]) is int and e[k] > 0 for k in ("pid", "pgid", "start"))
        ]


def report(table: str, key: str, reason: str) -> None:
    """A state file under `state_dir/driver/` that failed its check (the keeper's, driver/keeper_state.py)."""
    _findings.append(Finding(table, key, reason))
    log.error("containment.record_tampered", table=table, key=key)


def take_findings() -> list[Finding]:
    """Record files that failed their check, for the kernel to report (`journal.tampered`)."""
    out = list(_findings)
    _findings.clear()
    return out


def reap(entries: Iterable[dict[str, int]]) -> list[int]:
    """SIGKILL what a predecessor left: verified leaders and their groups. Returns the pids killed."""
    killed: set[int] = set()
    for e in entries:
        pid, pgid, start = int(e["pid"]), int(e["pgid"]), int(e["start"])
        current = start_time(pid)
        if current is not None and current != start:
            continue  # the pid was reused: that process and its group are not ours
        if current is not None and not _zombie(pid):  # a zombie is dead already: nothing to kill
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
        for member in _group_members(pgid, not_before=start):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(member, signal.SIGKILL)
                killed.add(member)
    return sorted(killed)


def _group_members(pgid: int, *, not_before: int) -> list[int]:
    members: list[int] = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields and fields[0] != "Z" and int(fields[2]) == pgid and int(fields[19]) >= not_before:
            members.append(int(entry.name))
    return members


def track(state_dir: Path, mac: RowMac | None = None) -> list[int]:
    """Called once, holding the state_dir lock, before any provider starts: kill what a previous
    process left behind (only when its record passes its check), then record what this one starts.
    Returns the pids killed."""
    global _record
    record = ProcessRecord(state_dir, mac)
    killed = reap(record.read()) if record.path.exists() else []
    if killed:
        log.warning("containment.predecessor_killed", pids=killed)
    record._write()  # start empty: everything recorded before is dead or was never ours
    _record = record
    return killed


def started(pid: int) -> None:
    if _record is not None:
        _record.add(pid)


def ended(pid: int) -> None:
    if _record is not None:
        _record.remove(pid)
