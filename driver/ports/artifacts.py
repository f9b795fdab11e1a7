"""Run inputs (PROTOCOL §6.5): attachments into `cwd/inputs/` (the outputs scan is driver.ports.outputs)."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from driver.ports.fetch import DEFAULT_DEADLINE_S, fetch
from driver.protocol.commands import Attachment

MAX_ATTACHMENT_BYTES = 256 * 1024 * 1024


class AttachmentError(Exception):
    pass


def attachment_path(cwd: Path, name: str) -> Path:
    """`cwd/inputs/<name>`; the name must be a plain file name (no folders, no `..`)."""
    pure = PurePosixPath(name)
    if len(pure.parts) != 1 or name in (".", "..") or "\\" in name or "\0" in name:
        raise AttachmentError(f"attachment name must be a plain file name: {name!r}")
    return cwd / "inputs" / name


async def download_attachments(
    cwd: Path, attachments: list[Attachment], *, deadline_s: float = DEFAULT_DEADLINE_S
) -> list[tuple[Attachment, Path]]:
    """Each attachment into cwd/inputs/, each within `deadline_s` overall; cancellable (a cancel
    abandons the download at once: driver.ports.fetch)."""
    done: list[tuple[Attachment, Path]] = []
    # The root is resolved once; below it the download refuses any symlink (fetch_to walks with O_NOFOLLOW).
    root = cwd.resolve()
    for att in attachments:
        dest = attachment_path(root, att.name)
        try:
            size = await fetch(
                att.url, dest, sha256=att.sha256, max_bytes=min(att.size, MAX_ATTACHMENT_BYTES), deadline_s=deadline_s
            )
        except Exception as exc:
            raise AttachmentError(f"attachment {att.name!r}: {exc}") from None
        if size != att.size:
            dest.unlink(missing_ok=True)
            raise AttachmentError(f"attachment {att.name!r}: got {size} bytes, expected {att.size}")
        done.append((att, attachment_path(cwd, att.name)))  # as the caller names cwd
    return done
