"""ACP `fs/read_text_file` and `fs/write_text_file` on the client side, behind path admission.

Every path goes through `FilePort.admit` (PROTOCOL §6.5: inside cwd, memory_dir or an additional
directory, after resolving symlinks). The open then walks the admitted path with `O_NOFOLLOW` at
every component (`open_admitted`), so a link planted between admission and the open, as the file or
in place of any parent directory, cannot redirect it. Errors are `JsonRpcError`s whose
message names the problem; a missing file is ACP's "resource not found" (-32002).
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import anyio

from driver.adapters.acp import models as m
from driver.adapters.common.base import FilePort, PathNotAllowed
from driver.adapters.common.jsonrpc import JsonRpcError
from driver.ports.files import open_admitted

# Keep a read well below the JSON-RPC line limit (64 MiB) once escaped into a response.
MAX_READ_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class WriteResult:
    path: Path
    created: bool
    sha256: str


def admit(files: FilePort, path: str) -> Path:
    if not path:
        raise JsonRpcError(m.INVALID_PARAMS, "path is empty")
    try:
        return files.admit(path)
    except PathNotAllowed as exc:
        raise JsonRpcError(m.INVALID_PARAMS, f"access denied: {exc}") from None


def _checked(files: FilePort, fd: int) -> None:
    """The driver's own files, reached by a hard link, are refused like their paths (PROTOCOL §9)."""
    try:
        files.check_opened(fd)
    except PathNotAllowed as exc:
        os.close(fd)
        raise JsonRpcError(m.INVALID_PARAMS, f"access denied: {exc}") from None


def _read(files: FilePort, path: Path, line: int | None, limit: int | None) -> str:
    try:
        # Non-blocking: opening a FIFO the agent made must not hold a worker thread (it is refused below).
        fd = open_admitted(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise JsonRpcError(m.RESOURCE_NOT_FOUND, f"file not found: {path}") from None
    except OSError as exc:
        raise JsonRpcError(m.INVALID_PARAMS, f"cannot read {path}: {_reason(exc)}") from None
    _checked(files, fd)
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise JsonRpcError(m.INVALID_PARAMS, f"not a regular file: {path}")
        data = fh.read(MAX_READ_BYTES + 1)
    if len(data) > MAX_READ_BYTES:
        raise JsonRpcError(m.INVALID_PARAMS, f"file larger than {MAX_READ_BYTES} bytes: {path}")
    text = data.decode("utf-8", errors="replace")
    if line is None and limit is None:
        return text
    lines = text.splitlines(keepends=True)
    start = max((line or 1) - 1, 0)  # ACP lines are 1-based
    end = len(lines) if limit is None else start + limit
    return "".join(lines[start:end])


def _write(files: FilePort, path: Path, content: str) -> WriteResult:
    data = content.encode("utf-8")
    try:
        fd = open_admitted(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, create_parents=True)
        created = True
    except FileExistsError:
        created = False
        try:
            # Not O_TRUNC: the open file is judged first (a hard link to the journal must not be
            # emptied by the very open that finds it out), then truncated. Non-blocking: a FIFO must
            # neither hold the open nor be written to.
            fd = open_admitted(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            raise JsonRpcError(m.INVALID_PARAMS, f"cannot write {path}: {_reason(exc)}") from None
        _checked(files, fd)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise JsonRpcError(m.INVALID_PARAMS, f"not a regular file: {path}") from None
        try:
            os.ftruncate(fd, 0)
        except OSError as exc:
            os.close(fd)
            raise JsonRpcError(m.INVALID_PARAMS, f"cannot write {path}: {_reason(exc)}") from None
    except OSError as exc:
        raise JsonRpcError(m.INVALID_PARAMS, f"cannot write {path}: {_reason(exc)}") from None
    with os.fdopen(fd, "wb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise JsonRpcError(m.INVALID_PARAMS, f"not a regular file: {path}")
        fh.write(data)
    return WriteResult(path, created, hashlib.sha256(data).hexdigest())


def _reason(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "is a symbolic link"
    if exc.errno == errno.ENOTDIR:
        return "a parent is not a directory (or is a symbolic link)"
    return exc.strerror or type(exc).__name__


async def read_text_file(files: FilePort, params: m.ReadTextFileParams) -> str:
    path = admit(files, params.path)
    return await anyio.to_thread.run_sync(_read, files, path, params.line, params.limit)


async def write_text_file(files: FilePort, params: m.WriteTextFileParams) -> WriteResult:
    path = admit(files, params.path)
    return await anyio.to_thread.run_sync(_write, files, path, params.content)
