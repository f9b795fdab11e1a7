"""Path admission (PROTOCOL §6.5): a path is usable only inside cwd, memory_dir or an additional
directory, judged after resolving symlinks, so a link that points out of the sandbox is refused.

The driver's own files are never admitted (PROTOCOL §9), even inside a root (`state_dir` inside
`cwd` is the protocol's own example): `state_dir/driver/` and the lock, judged after resolving, so a
symlink to them is refused too. A hard link cannot be seen in a path: `check_opened` compares what
was opened with the driver's files by device and inode, so a link the agent made to the journal
(possible only where the provider tree can see it: `containment.degraded`) is refused as well.
`admit_directory` is the rule for a working directory (`process.start`'s `cwd`, ACP terminals).

Admission alone is a check at one moment; the agent's tools can swap a directory for a symlink
right after it. So the open that follows goes through `open_admitted`, which walks the admitted
(fully resolved, hence symlink-free) path from `/` one component at a time with `O_NOFOLLOW`: a
component that has become a symlink since admission fails the open instead of redirecting it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path

from driver.interfaces import PathNotAllowed

NAME_MAX = 255  # bytes in one path component (Linux)
PATH_MAX = 4095  # bytes in a whole path, without its terminating NUL


def driver_private(state_dir: str | Path) -> list[Path]:
    """What of `state_dir` is the driver's alone: `driver/` (journal, records, markers) and the lock."""
    from driver.containment import LOCK_NAME

    return [Path(state_dir) / "driver", Path(state_dir) / LOCK_NAME]


class AllowedRoots:
    def __init__(
        self, cwd: str | Path, others: Iterable[str | Path | None] = (), private: Iterable[str | Path] = ()
    ) -> None:
        self.cwd = Path(cwd).resolve()
        self.roots = [self.cwd, *(Path(o).resolve() for o in others if o)]
        self.private = [Path(p).resolve() for p in private]

    def is_private(self, resolved: Path) -> bool:
        return any(resolved == p or resolved.is_relative_to(p) for p in self.private)

    def admit_tree(self, path: str | Path) -> Path:
        """A folder the driver replaces as a whole (a skill's): admitted, and holding none of the
        driver's files (a skill mounted at `.state` would otherwise wipe the journal)."""
        resolved = self.admit(path)
        if any(p.is_relative_to(resolved) for p in self.private):
            raise PathNotAllowed(f"path holds the driver's own state (state_dir/driver/), refused: {str(path)[:300]}")
        return resolved

    def admit_directory(self, path: str | Path) -> Path:
        """A working directory for a process the driver starts: admitted like any path, and a directory."""
        resolved = self.admit(path)
        if not resolved.is_dir():
            raise PathNotAllowed(f"not a directory: {str(path)[:300]}")
        return resolved

    def check_opened(self, fd: int) -> None:
        """Refuse an open file that is one of the driver's own (a hard link to it has another path)."""
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) in self.private_inodes():
            raise PathNotAllowed("the file is the driver's own state (a hard link to it)")

    def private_inodes(self) -> set[tuple[int, int]]:
        """(device, inode) of every file and folder of the driver's own state."""
        # Read each time (a handful of entries): the journal's WAL and records come and go.
        found: set[tuple[int, int]] = set()
        todo = list(self.private)
        while todo:
            p = todo.pop()
            try:
                st = p.lstat()
            except OSError:
                continue
            found.add((st.st_dev, st.st_ino))
            if p.is_dir() and not p.is_symlink() and len(found) < 4096:
                with contextlib.suppress(OSError):
                    todo.extend(Path(e.path) for e in os.scandir(p))
        return found

    def admit(self, path: str | Path) -> Path:
        text = str(path)
        if "\0" in text:
            raise PathNotAllowed("path contains a NUL byte")
        p = Path(path)
        if not p.is_absolute():
            p = self.cwd / p
        if len(os.fsencode(str(p))) > PATH_MAX:
            raise PathNotAllowed(f"path is longer than {PATH_MAX} bytes")
        if any(len(os.fsencode(part)) > NAME_MAX for part in p.parts):
            raise PathNotAllowed(f"a path component is longer than {NAME_MAX} bytes")
        # strict=False: a file about to be created does not exist yet; its parents still resolve.
        try:
            resolved = p.resolve(strict=False)
        except (OSError, RuntimeError) as exc:  # a symlink loop, an unreadable component
            raise PathNotAllowed(f"path cannot be resolved: {type(exc).__name__}") from None
        if self.is_private(resolved):
            raise PathNotAllowed(f"path is the driver's own state (state_dir/driver/), refused: {text[:300]}")
        for root in self.roots:
            if resolved == root or resolved.is_relative_to(root):
                return resolved
        raise PathNotAllowed(f"path is outside the allowed roots: {text[:300]}")


def open_admitted(path: Path, flags: int, mode: int = 0o644, *, create_parents: bool = False) -> int:
    """Open an admitted path without following any symlink on the way (see the module docstring).

    `path` must be what `admit` returned (absolute, resolved). Missing directories are created
    (mode 0755) when `create_parents`. Raises OSError: ELOOP or ENOTDIR when a component is (now) a
    symlink; the caller turns it into its own error.
    """
    if not path.is_absolute():
        raise ValueError("open_admitted needs an absolute, admitted path")
    parent_fd = open_directory(path.parent, create=create_parents)
    try:
        return os.open(path.name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=parent_fd)
    finally:
        os.close(parent_fd)


def open_directory(path: Path, *, create: bool = False) -> int:
    """An O_PATH descriptor of the directory `path` (absolute, resolved), walked with O_NOFOLLOW."""
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in path.parts[1:]:
            try:
                child = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                # Created meanwhile: fine, the open below judges what it is.
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
                child = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise
