"""Path admission (PROTOCOL §6.5): a path is usable only inside cwd, memory_dir or an additional
directory, judged after resolving symlinks, so a link that points out of the sandbox is refused."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from driver.interfaces import PathNotAllowed


class AllowedRoots:
    def __init__(self, cwd: str | Path, others: Iterable[str | Path | None] = ()) -> None:
        self.cwd = Path(cwd).resolve()
        self.roots = [self.cwd, *(Path(o).resolve() for o in others if o)]

    def admit(self, path: str | Path) -> Path:
        p = Path(path)
        if not p.is_absolute():
            p = self.cwd / p
        # strict=False: a file about to be created does not exist yet; its parents still resolve.
        resolved = p.resolve(strict=False)
        for root in self.roots:
            if resolved == root or resolved.is_relative_to(root):
                return resolved
        raise PathNotAllowed(f"path is outside the allowed roots: {path}")
