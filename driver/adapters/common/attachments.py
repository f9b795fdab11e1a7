"""`input.start` attachments as a runtime's own content (PROTOCOL §6.5), no provider import.

The kernel has downloaded every attachment into `cwd/inputs/` and named them in the prompt text (the
channel every runtime reads). Here an adapter learns which of them its runtime can also take
natively: images (by type, within the size the model APIs accept) and short UTF-8 texts. A runtime
that cannot take an image it is given refuses the run with `command.invalid` (AttachmentRefused)
rather than let the model answer without it.

`cwd/inputs/` is the agent's (PROTOCOL §9): between the download and these reads its processes can
make a file there a fifo (a plain open held the driver's event loop for good), a sparse giant or a
link to the driver's own files. Every read here goes through driver.agent_files (no link followed,
regular files only, bounded by the size the download checked).
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from driver import agent_files
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
    cwd: Path
    size: int  # the size the download checked: no more is read

    def _bytes(self) -> bytes:
        try:
            return agent_files.read_file(self.cwd, Path("inputs", self.name), max_bytes=self.size)
        except agent_files.AgentFileError as exc:
            raise AttachmentRefused(f"attachment {self.name!r} changed after its download: {exc}") from None

    def base64(self) -> str:
        return base64.b64encode(self._bytes()).decode("ascii")

    def text(self) -> str:
        try:
            return self._bytes().decode("utf-8")
        except UnicodeDecodeError:
            raise AttachmentRefused(f"attachment {self.name!r} changed after its download: not UTF-8") from None


def _is_text(cwd: Path, name: str, size: int) -> bool:
    if size > MAX_TEXT_BYTES:
        return False
    try:
        data = agent_files.read_file(cwd, Path("inputs", name), max_bytes=size)
    except agent_files.AgentFileError:
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
            out.append(LocalAttachment(att.name, path, "image", mime, cwd, att.size))
        elif _is_text(cwd, att.name, att.size):
            out.append(LocalAttachment(att.name, path, "text", "text/plain", cwd, att.size))
        else:
            out.append(LocalAttachment(att.name, path, "file", "application/octet-stream", cwd, att.size))
    return out
