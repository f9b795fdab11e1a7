"""Bounded, hash-checked downloads for attachments and skills (PROTOCOL §6.4, §6.5).

`file:` and `http(s):` URLs only. The body is streamed into a temporary file beside the destination
while its SHA-256 is computed and its size capped; only a complete, matching download is renamed into
place, so a failed fetch never leaves a partial file where a provider could read it.

Every download has an overall deadline besides the per-read timeout (a server that trickles one byte
a minute passes every per-read timeout), and can be cancelled (`turn.cancel` during an attachment's
download): the blocking transfer runs in a worker thread that the caller abandons at once; the thread
is woken (its socket shut down) and, whenever it next runs, deletes its temporary file and never
renames it into place (`Download`, whose lock orders the rename against the abandonment).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import socket
import stat
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urlsplit

import anyio

from driver.ports.files import open_directory

CHUNK = 64 * 1024
DEFAULT_TIMEOUT_S = 60.0  # per read (and for the connection)
DEFAULT_DEADLINE_S = 300.0  # the whole download


class FetchError(Exception):
    pass


class Download:
    """What the loop and the worker thread of one download share: whether the caller gave up on it,
    whether it completed, and the socket to shut down to wake a read blocked on it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.abandoned = False
        self.completed = False
        self.sock: socket.socket | None = None

    def abandon(self) -> bool:
        """Give up on the download; True if it had already completed (renamed into place)."""
        with self.lock:
            self.abandoned = True
            sock, done = self.sock, self.completed
        if sock is not None and not done:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # a read blocked on it returns now
        return done

    def check(self, deadline: float | None) -> None:
        if self.abandoned:
            raise FetchError("the download was abandoned")
        if deadline is not None and time.monotonic() > deadline:
            raise FetchError("the download passed its deadline")


def _open(url: str, timeout: float) -> tuple[BinaryIO, int | None]:
    import urllib.request  # here, not at the top: it costs the daemon's cold start ~10 ms (email, http)

    parts = urlsplit(url)
    scheme = parts.scheme
    if scheme == "file":
        path = urllib.request.url2pathname(parts.path)
        try:
            # Non-blocking: a FIFO must not hold the open (it is refused below, as any non-file).
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            raise FetchError(f"cannot read {path}: {exc.strerror}") from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise FetchError(f"cannot read {path}: not a regular file")
        return os.fdopen(fd, "rb"), st.st_size
    if scheme in ("http", "https"):
        try:
            resp = urllib.request.urlopen(url, timeout=timeout)  # the scheme was checked above
        except OSError as exc:
            raise FetchError(f"download failed: {exc}") from None
        length = resp.headers.get("Content-Length")
        return resp, int(length) if length and length.isdigit() else None
    raise FetchError(f"unsupported URL scheme {scheme!r} (file, http, https)")


def _socket_of(src: Any) -> socket.socket | None:
    """The socket under an http.client response, if it can be found (to wake a blocked read)."""
    raw = getattr(getattr(src, "fp", None), "raw", None)
    sock = getattr(raw, "_sock", None)
    return sock if isinstance(sock, socket.socket) else None


def fetch_to(
    url: str,
    dest: Path,
    *,
    sha256: str,
    max_bytes: int,
    timeout: float = DEFAULT_TIMEOUT_S,
    deadline: float | None = None,
    download: Download | None = None,
) -> int:
    """Download `url` to `dest` (atomically); return its size. Raises FetchError naming the problem.

    `dest` is an admitted path: its directory is walked with O_NOFOLLOW (`open_directory`) and the
    temporary file and the final rename are relative to that descriptor, so a parent swapped for a
    symlink after admission cannot send the bytes elsewhere."""
    try:
        dir_fd = open_directory(dest.parent.absolute(), create=True)
    except OSError as exc:
        raise FetchError(f"cannot open {dest.parent}: {_reason(exc)}") from None
    dl = download or Download()
    try:
        return _fetch_into(
            url, dir_fd, dest.name, sha256=sha256, max_bytes=max_bytes, timeout=timeout, dl=dl, end=deadline
        )
    finally:
        os.close(dir_fd)


def _fetch_into(
    url: str, dir_fd: int, name: str, *, sha256: str, max_bytes: int, timeout: float, dl: Download, end: float | None
) -> int:
    dl.check(end)
    src, declared = _open(url, timeout)
    with src:
        with dl.lock:
            dl.sock = _socket_of(src)
        if declared is not None and declared > max_bytes:
            raise FetchError(f"{declared} bytes is over the {max_bytes}-byte limit")
        digest = hashlib.sha256()
        size = 0
        tmp = f".fetch-{secrets.token_hex(8)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
        try:
            with os.fdopen(fd, "wb") as out:
                while True:
                    dl.check(end)
                    try:
                        chunk = src.read(CHUNK)
                    except OSError as exc:  # a read timeout, a reset, our own shutdown
                        dl.check(end)
                        raise FetchError(f"download failed: {exc}") from None
                    if not chunk:
                        break
                    size += len(chunk)
                    if size > max_bytes:
                        raise FetchError(f"over the {max_bytes}-byte limit")
                    digest.update(chunk)
                    out.write(chunk)
            if digest.hexdigest() != sha256:
                raise FetchError("sha256 does not match")
            with dl.lock:  # never renamed into place once the caller gave up
                dl.check(None)
                os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
                dl.completed = True
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
    return size


def _reason(exc: OSError) -> str:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return "a parent is a symbolic link or not a directory"
    return exc.strerror or type(exc).__name__


async def fetch(url: str, dest: Path, *, sha256: str, max_bytes: int, deadline_s: float = DEFAULT_DEADLINE_S) -> int:
    """`fetch_to` within `deadline_s` seconds overall, cancellable: on a cancel or the deadline the
    worker thread is abandoned at once (it cleans up after itself, see `Download`)."""
    dl = Download()
    end = time.monotonic() + deadline_s
    job = partial(fetch_to, url, dest, sha256=sha256, max_bytes=max_bytes, deadline=end, download=dl)
    size: int | None = None
    try:
        with anyio.move_on_after(deadline_s):
            size = await anyio.to_thread.run_sync(job, abandon_on_cancel=True)
    finally:
        if size is None and dl.abandon() and dest.exists():
            # Renamed into place just as we gave up: the file is whole and checked.
            size = dest.stat().st_size
    if size is None:
        raise FetchError(f"the download did not finish within {deadline_s:g} s")
    return size
