"""Bounded, hash-checked downloads for attachments and skills (PROTOCOL §6.4, §6.5).

`file:` and `http(s):` URLs only. The body is streamed into a temporary file beside the destination
while its SHA-256 is computed and its size capped; only a complete, matching download is renamed into
place, so a failed fetch never leaves a partial file where a provider could read it.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urlsplit

import anyio

CHUNK = 64 * 1024
DEFAULT_TIMEOUT_S = 60.0


class FetchError(Exception):
    pass


def _open(url: str, timeout: float) -> tuple[BinaryIO, int | None]:
    import urllib.request  # here, not at the top: it costs the daemon's cold start ~10 ms (email, http)

    parts = urlsplit(url)
    scheme = parts.scheme
    if scheme == "file":
        path = urllib.request.url2pathname(parts.path)
        try:
            f = open(path, "rb")  # noqa: SIM115 - closed by the caller
        except OSError as exc:
            raise FetchError(f"cannot read {path}: {exc.strerror}") from None
        return f, os.fstat(f.fileno()).st_size
    if scheme in ("http", "https"):
        try:
            resp = urllib.request.urlopen(url, timeout=timeout)  # the scheme was checked above
        except OSError as exc:
            raise FetchError(f"download failed: {exc}") from None
        length = resp.headers.get("Content-Length")
        return resp, int(length) if length and length.isdigit() else None
    raise FetchError(f"unsupported URL scheme {scheme!r} (file, http, https)")


def fetch_to(url: str, dest: Path, *, sha256: str, max_bytes: int, timeout: float = DEFAULT_TIMEOUT_S) -> int:
    """Download `url` to `dest` (atomically); return its size. Raises FetchError naming the problem."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    src, declared = _open(url, timeout)
    with src:
        if declared is not None and declared > max_bytes:
            raise FetchError(f"{declared} bytes is over the {max_bytes}-byte limit")
        digest = hashlib.sha256()
        size = 0
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".fetch-")
        try:
            with os.fdopen(fd, "wb") as out:
                while chunk := src.read(CHUNK):
                    size += len(chunk)
                    if size > max_bytes:
                        raise FetchError(f"over the {max_bytes}-byte limit")
                    digest.update(chunk)
                    out.write(chunk)
            if digest.hexdigest() != sha256:
                raise FetchError("sha256 does not match")
            os.replace(tmp, dest)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return size


async def fetch(url: str, dest: Path, *, sha256: str, max_bytes: int) -> int:
    return await anyio.to_thread.run_sync(lambda: fetch_to(url, dest, sha256=sha256, max_bytes=max_bytes))
