"""`input.start` attachments as a runtime's own content (PROTOCOL §6.5), no provider import.

The kernel has downloaded every attachment into `cwd/inputs/` and named them in the prompt text (the
channel every runtime reads). Here an adapter learns which of them its runtime can also take
natively: images (by type, within the size the model APIs accept) and short UTF-8 texts. A runtime
that cannot take an image it is given refuses the run with `command.invalid` (AttachmentRefused)
rather than let the model answer without it.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from driver.protocol.commands import Attachment

IMAGE_TYPES: dict[str, str] = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
    ".webp": "image/webp",
}
MAX_IMAGE_BYTES = 5 * 1024 * 1024  # the Anthropic API's per-image limit; the smallest of our runtimes'
MAX_TEXT_BYTES = 256 * 1024  # embedded in the prompt only below this; larger texts stay files


class AttachmentRefused(Exception):
    """The runtime cannot take this attachment: the adapter raises ProviderError("command.invalid")."""


@dataclass(frozen=True, slots=True)
class LocalAttachment:
    name: str
    path: Path  # cwd/inputs/<name>
    kind: str  # "image" | "text" | "file"
    mime_type: str

    def base64(self) -> str:
        return base64.b64encode(self.path.read_bytes()).decode("ascii")

    def text(self) -> str:
        return self.path.read_text(encoding="utf-8")


def _is_text(path: Path) -> bool:
    try:
        if path.stat().st_size > MAX_TEXT_BYTES:
            return False
        data = path.read_bytes()
    except OSError:
        return False
    if b"\0" in data:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def local(
    cwd: Path, attachments: Iterable[Attachment], *, max_image_bytes: int | None = MAX_IMAGE_BYTES
) -> list[LocalAttachment]:
    """What each downloaded attachment is. An image above `max_image_bytes` is refused (a runtime that
    sends images inline to the model API; Codex reads and scales them itself: None)."""
    out: list[LocalAttachment] = []
    for att in attachments:
        path = cwd / "inputs" / att.name
        mime = IMAGE_TYPES.get(path.suffix.lower())
        if mime is not None:
            if max_image_bytes is not None and att.size > max_image_bytes:
                raise AttachmentRefused(
                    f"attachment {att.name!r}: images above {max_image_bytes // (1024 * 1024)} MiB are not accepted"
                )
            out.append(LocalAttachment(att.name, path, "image", mime))
        elif _is_text(path):
            out.append(LocalAttachment(att.name, path, "text", "text/plain"))
        else:
            out.append(LocalAttachment(att.name, path, "file", "application/octet-stream"))
    return out
