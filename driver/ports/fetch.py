"""Bounded, hash-checked downloads for attachments and skills (PROTOCOL §6.4, §6.5).

`file:` and `http(s):` URLs only. The body is streamed into a temporary file beside the destination
while its SHA-256 is computed and its size capped; only a complete, matching download is renamed into
place, so a failed fetch never leaves a partial file where a provider could read it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urlsplit

import anyio

from driver.ports.files import open_directory

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
    """Download `url` to `dest` (atomically); return its size. Raises FetchError naming the problem.

    `dest` is an admitted path: its directory is walked with O_NOFOLLOW (`open_directory`) and the
    temporary file and the final rename are relative to that descriptor, so a parent swapped for a
    symlink after admission cannot send the bytes elsewhere."""
    try:
        dir_fd = open_directory(dest.parent.absolute(), create=True)
    except OSError as exc:
        raise FetchError(f"cannot open {dest.parent}: {_reason(exc)}") from None
    try:
        return _fetch_into(url, dir_fd, dest.name, sha256=sha256, max_bytes=max_bytes, timeout=timeout)
    finally:
        os.close(dir_fd)


def _fetch_into(url: str, dir_fd: int, name: str, *, sha256: str, max_bytes: int, timeout: float) -> int:
    src, declared = _open(url, timeout)
    with src:
        if declared is not None and declared > max_bytes:
            raise FetchError(f"{declared} bytes is over the {max_bytes}-byte limit")
        digest = hashlib.sha256()
        size = 0
        tmp = f".fetch-{secrets.token_hex(8)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
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
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
    return size


def _reason(exc: OSError) -> str:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return "a parent is a symbolic link or not a directory"
    return exc.strerror or type(exc).__name__


async def fetch(url: str, dest: Path, *, sha256: str, max_bytes: int) -> int:
    return await anyio.to_thread.run_sync(lambda: fetch_to(url, dest, sha256=sha256, max_bytes=max_bytes))
