"""Run inputs and outputs (PROTOCOL §6.5): attachments into `cwd/inputs/`, artifacts from `cwd/outputs/`."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Set
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from driver.ports.fetch import fetch
from driver.protocol.commands import Attachment

MAX_ATTACHMENT_BYTES = 256 * 1024 * 1024


class AttachmentError(Exception):
    pass


@dataclass(frozen=True, slots=True)
class FileState:
    size: int
    mtime_ns: int


def attachment_path(cwd: Path, name: str) -> Path:
    """`cwd/inputs/<name>`; the name must be a plain file name (no folders, no `..`)."""
    pure = PurePosixPath(name)
    if len(pure.parts) != 1 or name in (".", "..") or "\\" in name or "\0" in name:
        raise AttachmentError(f"attachment name must be a plain file name: {name!r}")
    return cwd / "inputs" / name


async def download_attachments(cwd: Path, attachments: list[Attachment]) -> list[tuple[Attachment, Path]]:
    done: list[tuple[Attachment, Path]] = []
    # The root is resolved once; below it the download refuses any symlink (fetch_to walks with O_NOFOLLOW).
    root = cwd.resolve()
    for att in attachments:
        dest = attachment_path(root, att.name)
        try:
            size = await fetch(att.url, dest, sha256=att.sha256, max_bytes=min(att.size, MAX_ATTACHMENT_BYTES))
        except Exception as exc:
            raise AttachmentError(f"attachment {att.name!r}: {exc}") from None
        if size != att.size:
            dest.unlink(missing_ok=True)
            raise AttachmentError(f"attachment {att.name!r}: got {size} bytes, expected {att.size}")
        done.append((att, attachment_path(cwd, att.name)))  # as the caller names cwd
    return done


def snapshot_outputs(cwd: Path, private: Set[tuple[int, int]] = frozenset()) -> dict[str, FileState]:
    """Size and mtime of every regular file under `cwd/outputs/` (symlinks are not followed, not even
    `outputs` itself). `private`: (device, inode) of the driver's own files, left out (PROTOCOL §9:
    a hard link to the journal in outputs/ is not an artifact)."""
    root = cwd / "outputs"
    out: dict[str, FileState] = {}
    if root.is_symlink() or not root.is_dir():
        return out
    for dirpath, _dirs, files in os.walk(root, followlinks=False):
        for name in files:
            p = Path(dirpath) / name
            try:
                st = p.lstat()
            except OSError:
                continue
            if p.is_symlink() or not p.is_file() or (st.st_dev, st.st_ino) in private:
                continue
            out[str(p.relative_to(cwd))] = FileState(st.st_size, st.st_mtime_ns)
    return out


def changed_outputs(
    cwd: Path, before: dict[str, FileState], private: Set[tuple[int, int]] = frozenset()
) -> list[tuple[str, int, str]]:
    """(path relative to cwd, size, sha256) of files under outputs/ that are new or changed since `before`."""
    result: list[tuple[str, int, str]] = []
    for rel, state in sorted(snapshot_outputs(cwd, private).items()):
        if before.get(rel) == state:
            continue
        digest = hashlib.sha256()
        with open(cwd / rel, "rb") as f:
            while chunk := f.read(1 << 16):
                digest.update(chunk)
        result.append((rel, state.size, digest.hexdigest()))
    return result
