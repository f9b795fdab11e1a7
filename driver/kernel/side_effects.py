"""What a cancelled run leaves behind (PROTOCOL §5): the files under `cwd` created, modified or deleted
since the run started, and the provider-tree processes still alive when the terminal was chosen.

Side effects already done are not undone; the `run.cancelled` payload says what they are. The scan is
a plain walk of `cwd` (stat only, no reads), bounded in entries so a huge workspace costs a bounded
time; a scan that hit the bound says so (`truncated`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAX_ENTRIES = 20_000

FileState = tuple[int, int]  # (size, mtime_ns)


@dataclass(slots=True)
class TreeSnapshot:
    files: dict[str, FileState] = field(default_factory=dict)
    truncated: bool = False


def snapshot(root: Path, exclude: list[Path], limit: int = MAX_ENTRIES) -> TreeSnapshot:
    """Every regular file (and symlink) under `root`, by relative path, outside the `exclude` folders."""
    out = TreeSnapshot()
    skip = {os.path.realpath(p) for p in exclude}
    stack = [str(root)]
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            if len(out.files) >= limit:
                out.truncated = True
                return out
            try:
                if entry.is_dir(follow_symlinks=False):
                    if os.path.realpath(entry.path) not in skip:
                        stack.append(entry.path)
                    continue
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            out.files[os.path.relpath(entry.path, root)] = (st.st_size, st.st_mtime_ns)
    return out


def files_changed(before: TreeSnapshot, after: TreeSnapshot) -> list[dict[str, str]]:
    """`[{path, change}]`, sorted by path: created, modified (size or mtime) or deleted."""
    out: list[dict[str, str]] = []
    for path in sorted(before.files.keys() | after.files.keys()):
        old, new = before.files.get(path), after.files.get(path)
        if old is None:
            out.append({"path": path, "change": "created"})
        elif new is None:
            if not after.truncated:  # a truncated scan cannot tell a deletion from an unread file
                out.append({"path": path, "change": "deleted"})
        elif old != new:
            out.append({"path": path, "change": "modified"})
    return out


def tree_processes(roots: list[int]) -> list[dict[str, Any]]:
    """`[{pid, argv0}]` of the live (non-zombie) processes in the trees under `roots`."""
    out: list[dict[str, Any]] = []
    seen: set[int] = set()
    stack = list(roots)
    while stack and len(seen) < 4096:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state in (b"Z", b"X"):
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv0 = f.read().split(b"\0", 1)[0].decode(errors="replace")
        except OSError:
            argv0 = ""
        out.append({"pid": pid, "argv0": argv0})
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                    stack.extend(int(c) for c in f.read().split())
            except (OSError, ValueError):
                continue
    return sorted(out, key=lambda p: p["pid"])
