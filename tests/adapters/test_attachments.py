"""What an adapter may hand its runtime natively (driver/adapters/common/attachments.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from driver.adapters.common import attachments
from tests.helpers.attachments import place, png


def test_images_texts_and_other_files(tmp_path: Path) -> None:
    given = [
        place(tmp_path, "pic.PNG", png()),
        place(tmp_path, "notes.md", "héllo".encode()),
        place(tmp_path, "blob.bin", b"\x00\x01\x02"),
        place(tmp_path, "latin.txt", "café".encode("latin-1")),  # not UTF-8: a file, not a text
    ]
    found = attachments.local(tmp_path, given)
    assert [(a.name, a.kind, a.mime_type) for a in found] == [
        ("pic.PNG", "image", "image/png"),
        ("notes.md", "text", "text/plain"),
        ("blob.bin", "file", "application/octet-stream"),
        ("latin.txt", "file", "application/octet-stream"),
    ]
    assert found[1].text() == "héllo" and found[0].base64().startswith("iVBOR")


def test_an_image_too_large_to_send_inline_is_refused(tmp_path: Path) -> None:
    big = place(tmp_path, "big.jpg", b"\xff" * 16)
    big = type(big)(name=big.name, url=big.url, sha256=big.sha256, size=attachments.MAX_IMAGE_BYTES + 1)
    with pytest.raises(attachments.AttachmentRefused, match=r"big\.jpg.*5 MiB"):
        attachments.local(tmp_path, [big])
    # Codex reads and scales images itself: no limit there.
    assert attachments.local(tmp_path, [big], max_image_bytes=None)[0].kind == "image"
