"""Running a command as another uid from any clone: the checkout may sit under a folder that uid
cannot search (a clone under a 0700 home or `mktemp -d`), and so may the interpreter the tests run
(e.g. a pyenv under /root).

As root, the command runs in a private mount namespace where each such folder is covered by an empty
tmpfs (mode 0755) and the paths the command needs are bound back at their own places, so every
absolute path in a boot payload, a venv or an editable install stays valid. Bind mounts do not need
the source's parents to be searchable by the uid that reads through them (as `tests/image/sandbox.py`
binds node_modules for the image's uid). Nothing changes outside the namespace.
"""

from __future__ import annotations

import os
import shlex
import stat
import sys
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def interpreter_paths() -> list[Path]:
    """What a child `sys.executable` needs: this checkout (its venv and sources) and the base
    interpreter's prefix (its standard library)."""
    return [ROOT, Path(sys.base_prefix).resolve()]


def blocking_ancestor(path: Path) -> Path | None:
    """The topmost folder above `path` that others may not search (no o+x), or None."""
    for parent in reversed(path.resolve().parents):  # "/" first
        if not os.stat(parent).st_mode & stat.S_IXOTH:
            return parent
    return None


def as_uid(uid: int, gid: int, needed: Iterable[Path]) -> list[str]:
    """A command prefix (as root): `needed` made reachable as above, then the command as uid:gid
    with no supplementary groups."""
    paths = sorted({p.resolve() for p in needed})
    covers: list[Path] = []
    for cover in sorted({a for p in paths if (a := blocking_ancestor(p)) is not None}):
        if not any(cover.is_relative_to(c) for c in covers):
            covers.append(cover)
    # Only paths under a cover are bound back; one inside another comes back with it.
    back: list[Path] = []
    for p in paths:
        if any(p.is_relative_to(c) for c in covers) and not any(p.is_relative_to(b) for b in back):
            back.append(p)
    assert len(back) <= 7, back  # file descriptors 3..9 in sh
    q = shlex.quote
    # Each path is opened before the covers hide it, and bound back from its descriptor.
    lines = ["set -e"]
    lines += [f"exec {fd}< {q(str(p))}" for fd, p in enumerate(back, 3)]
    lines += [f"mount -t tmpfs -o mode=0755 reach {q(str(c))}" for c in covers]
    for fd, p in enumerate(back, 3):
        # --no-canonicalize: mount would resolve the descriptor to its (now covered) path.
        lines += [f"mkdir -p {q(str(p))}", f"mount --no-canonicalize --bind /proc/self/fd/{fd} {q(str(p))}"]
        lines.append(f"exec {fd}<&-")
    lines.append('exec "$@"')
    switch = ["/usr/bin/setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"]
    if not covers:
        return switch
    return ["/usr/bin/unshare", "--mount", "--propagation", "private", "--",
            "/bin/sh", "-c", "\n".join(lines), "sh", *switch]  # fmt: skip
