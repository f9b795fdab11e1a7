"""Path admission (PROTOCOL §6.5): a path is usable only inside cwd, memory_dir or an additional
directory, judged after resolving symlinks, so a link that points out of the sandbox is refused.

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


class AllowedRoots:
    def __init__(self, cwd: str | Path, others: Iterable[str | Path | None] = ()) -> None:
        self.cwd = Path(cwd).resolve()
        self.roots = [self.cwd, *(Path(o).resolve() for o in others if o)]

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
