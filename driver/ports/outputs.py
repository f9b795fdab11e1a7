"""The outputs scan (PROTOCOL §6.5, §9): every file under `cwd/outputs/` that is new or changed since
the run started, reported as `artifact.produced`, without ever leaving `cwd`.

The agent controls this tree, so the scan trusts nothing in it:
- `outputs/` itself must be a real directory: a symlinked `outputs/` is refused (reported, not walked).
- Below it, every folder and file is opened relative to its parent's descriptor with `O_NOFOLLOW`: a
  symlink is never followed, and a folder swapped for a link mid-scan is not entered.
- A file or folder that vanishes (or turns into something else) mid-scan is skipped; the rest is kept.
- It is bounded: at most `MAX_ENTRIES` entries walked and `MAX_DEPTH` levels, at most `MAX_FILES`
  artifacts reported, `MAX_HASH_BYTES` hashed and `MAX_HASH_S` spent hashing per run (the run's
  terminal waits for this report, a cancelled run's too); what was cut is described (`Cut`) so the
  caller reports it in a diagnostic.
- Folders listed in `exclude` (the driver's own state, when it lives under `outputs/`) are skipped.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
import time
from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path

from driver.ports.files import open_directory

MAX_ENTRIES = 20_000  # directory entries looked at per scan
MAX_DEPTH = 32  # folder levels below outputs/
MAX_FILES = 1_000  # artifacts reported per run
MAX_HASH_BYTES = 1 << 30  # bytes read to hash per run
MAX_HASH_S = 10.0  # time spent hashing per run: a run's terminal waits for this report
CHUNK = 1 << 16
OUTPUTS = "outputs"

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class FileState:
    size: int
    mtime_ns: int


@dataclass(slots=True)
class Snapshot:
    files: dict[str, FileState] = field(default_factory=dict)  # path relative to cwd → state
    refused: str | None = None  # why outputs/ was not walked at all
    truncated: str | None = None  # which walk bound was hit ("entries", "depth")


@dataclass(frozen=True, slots=True)
class Cut:
    reason: str  # "entries", "depth", "files", "bytes", "time"
    reported: int
    left: int  # changed files known but not reported (a lower bound when the walk itself was cut)


@dataclass(slots=True)
class Report:
    artifacts: list[tuple[str, int, str]] = field(default_factory=list)  # (path, size, sha256)
    refused: str | None = None
    cut: Cut | None = None


class Bounds:
    """The limits of one scan (module defaults; tests pass smaller ones)."""

    def __init__(
        self,
        *,
        entries: int = MAX_ENTRIES,
        depth: int = MAX_DEPTH,
        files: int = MAX_FILES,
        hash_bytes: int = MAX_HASH_BYTES,
        hash_s: float = MAX_HASH_S,
    ) -> None:
        self.entries, self.depth, self.files, self.hash_bytes = entries, depth, files, hash_bytes
        self.hash_s = hash_s


DEFAULT_BOUNDS = Bounds()


def _open_outputs(cwd: Path) -> tuple[int | None, str | None]:
    """(descriptor of cwd/outputs, None), (None, None) when there is no outputs/, or (None, reason)."""
    try:
        cwd_fd = open_directory(cwd.resolve())
    except OSError as exc:
        return None, f"cwd cannot be opened ({exc.strerror or type(exc).__name__})"
    try:
        return os.open(OUTPUTS, _DIR_FLAGS, dir_fd=cwd_fd), None
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        try:
            st = os.stat(OUTPUTS, dir_fd=cwd_fd, follow_symlinks=False)
        except OSError:
            return None, None  # vanished meanwhile
        if stat.S_ISLNK(st.st_mode):
            return None, "outputs/ is a symbolic link; it is not followed"
        if exc.errno == errno.ENOTDIR:
            return None, "outputs is not a directory"
        return None, f"outputs/ cannot be opened ({exc.strerror or type(exc).__name__})"
    finally:
        os.close(cwd_fd)


def _open_path(root_fd: int, parts: tuple[str, ...], *, final: int = _DIR_FLAGS) -> int:
    """Open `parts` below `root_fd`, every component with O_NOFOLLOW (the last with `final` flags)."""
    fd = os.dup(root_fd)
    try:
        for i, part in enumerate(parts):
            child = os.open(part, final if i == len(parts) - 1 else _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def _identities(paths: Iterable[Path]) -> set[tuple[int, int]]:
    out: set[tuple[int, int]] = set()
    for p in paths:
        with contextlib.suppress(OSError):
            st = os.stat(p)
            out.add((st.st_dev, st.st_ino))
    return out


def snapshot(
    cwd: Path,
    exclude: Iterable[Path] = (),
    bounds: Bounds = DEFAULT_BOUNDS,
    private: AbstractSet[tuple[int, int]] = frozenset(),
) -> Snapshot:
    """Size and mtime of every regular file under `cwd/outputs/` (no symlink followed, bounded).
    `private`: (device, inode) of the driver's own files, never artifacts (PROTOCOL §9: a hard link to
    the journal under outputs/ has another path but the same inode)."""
    out = Snapshot()
    root_fd, out.refused = _open_outputs(cwd)
    if root_fd is None:
        return out
    skip = _identities(exclude) | set(private)
    seen = 0
    try:
        stack: list[tuple[str, ...]] = [()]
        while stack:
            parts = stack.pop()
            try:
                fd = _open_path(root_fd, parts) if parts else os.dup(root_fd)
            except OSError:
                continue  # vanished, or swapped for a link: not entered
            try:
                # Stat while the folder's descriptor is open: entries of an fd scan stat through it.
                listed = _list(fd, bounds.entries - seen)
            finally:
                os.close(fd)
            for name, st in listed:
                seen += 1
                if seen > bounds.entries:
                    out.truncated = "entries"
                    return out
                if stat.S_ISDIR(st.st_mode):
                    if (st.st_dev, st.st_ino) in skip:
                        continue
                    if len(parts) + 1 >= bounds.depth:
                        out.truncated = "depth"
                        continue
                    stack.append((*parts, name))
                elif stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in skip:
                    rel = "/".join((OUTPUTS, *parts, name))
                    out.files[rel] = FileState(st.st_size, st.st_mtime_ns)
                # symlinks, sockets, FIFOs, devices: not artifacts
    finally:
        os.close(root_fd)
    return out


def _list(fd: int, room: int) -> list[tuple[str, os.stat_result]]:
    """(name, lstat) of the entries of the folder `fd`, at most `room` + 1 of them (one more than
    fits tells the caller the bound was hit); an entry that vanished meanwhile is left out."""
    out: list[tuple[str, os.stat_result]] = []
    try:
        with os.scandir(fd) as it:
            for entry in it:
                if len(out) > room:
                    break
                try:
                    out.append((entry.name, entry.stat(follow_symlinks=False)))
                except OSError:
                    continue  # vanished mid-scan
    except OSError:
        pass  # the folder itself vanished: what was read is kept
    return out


def _digest(root_fd: int, rel: str, budget: int, end: float) -> tuple[int, str] | None:
    """(size, sha256) of the regular file `rel` (relative to cwd) read through `root_fd`; None if it
    vanished or is no longer a regular file. Raises _OverBudget past `budget` bytes, _OverTime past
    the monotonic time `end`."""
    parts = tuple(rel.split("/")[1:])
    try:
        fd = _open_path(root_fd, parts, final=_FILE_FLAGS)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        if st.st_size > budget:
            raise _OverBudget
        digest = hashlib.sha256()
        size = 0
        while chunk := os.read(fd, CHUNK):
            if time.monotonic() > end:
                raise _OverTime
            size += len(chunk)
            if size > budget:
                raise _OverBudget
            digest.update(chunk)
        return size, digest.hexdigest()
    except OSError:
        return None
    finally:
        os.close(fd)


class _OverBudget(Exception):
    pass


class _OverTime(Exception):
    pass


def changed(
    cwd: Path,
    before: Snapshot | dict[str, FileState],
    exclude: Iterable[Path] = (),
    bounds: Bounds = DEFAULT_BOUNDS,
    private: AbstractSet[tuple[int, int]] = frozenset(),
) -> Report:
    """The files under outputs/ that are new or changed since `before`, hashed, within the bounds."""
    old = before.files if isinstance(before, Snapshot) else before
    after = snapshot(cwd, exclude, bounds, private)
    report = Report(refused=after.refused)
    todo = [(rel, st) for rel, st in sorted(after.files.items()) if old.get(rel) != st]
    if not todo:
        if after.truncated:
            report.cut = Cut(after.truncated, 0, 0)
        return report
    root_fd, refused = _open_outputs(cwd)
    if root_fd is None:
        report.refused = refused or "outputs/ vanished during the scan"
        return report
    budget = bounds.hash_bytes
    end = time.monotonic() + bounds.hash_s
    reason = after.truncated
    done = 0  # files of `todo` looked at
    try:
        for rel, _st in todo:
            if len(report.artifacts) >= bounds.files:
                reason = "files"
                break
            try:
                got = _digest(root_fd, rel, budget, end)
            except _OverBudget:
                reason = "bytes"
                break
            except _OverTime:
                reason = "time"
                break
            done += 1
            if got is None:
                continue  # vanished since the walk: the others are still reported
            size, digest = got
            budget -= size
            report.artifacts.append((rel, size, digest))
        if reason is not None:
            report.cut = Cut(reason, len(report.artifacts), len(todo) - done)
    finally:
        os.close(root_fd)
    return report
