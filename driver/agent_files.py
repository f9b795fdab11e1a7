"""Files in folders the agent can write (PROTOCOL §9: "What the agent can write is input").

The provider's home, `CODEX_HOME`, `cwd`, `memory_dir` and everything under `state_dir/providers/`
belong to the agent. The driver writes there from outside the provider's mount namespace, so a
symlink the agent planted would send a plain `Path.write_text` anywhere the driver can write (its own
hidden journal included), and a sparse giant would make a plain `read_bytes` allocate what the agent
never paid for in disk. Every write and read of the driver's in such a folder goes through here:

- `root` is a folder the driver trusts as a starting point (it made it, or the boot payload named it);
  it is resolved once. Everything below it is walked component by component with `O_NOFOLLOW`, so a
  link anywhere below `root` is refused, not followed.
- A write goes to a fresh `O_CREAT|O_EXCL` name in the target's folder, is flushed, then renamed over
  the target: a planted link at the target's name is replaced, never written through.
- A read opens with `O_NOFOLLOW|O_NONBLOCK` (a fifo cannot hold it), requires a regular file and
  checks its size from `fstat` before reading a byte.

Each problem raises `AgentFileError` naming the path and what was wrong, for the unit that met it to
fail with; nothing here may end the daemon.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from pathlib import Path, PurePosixPath

_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class AgentFileError(Exception):
    """A file or folder in an agent-writable place is not what the driver expects (the message says why)."""


def _parts(relative: str | os.PathLike[str]) -> tuple[str, ...]:
    parts = PurePosixPath(os.fspath(relative)).parts
    if not parts or parts[0] == "/" or any(p in ("..", ".") for p in parts):
        raise AgentFileError(f"{os.fspath(relative)!r} is not a plain relative path")
    return parts


def _describe(exc: OSError) -> str:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return "a symbolic link or not a folder"
    return exc.strerror or type(exc).__name__


def open_folder(root: Path, relative: str | os.PathLike[str] = "", *, create: bool = False, mode: int = 0o700) -> int:
    """An `O_PATH` descriptor of the folder `root/relative`, walked below `root` with `O_NOFOLLOW`.

    With `create`, missing folders are made (`mode`). The caller closes the descriptor."""
    try:
        fd = os.open(root.resolve(), _DIR_FLAGS & ~os.O_NOFOLLOW)
    except OSError as exc:
        raise AgentFileError(f"{root}: {_describe(exc)}") from None
    here = root
    try:
        for part in _parts(relative) if os.fspath(relative) not in ("", ".") else ():
            here = here / part
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise AgentFileError(f"{here}: no such folder") from None
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, mode, dir_fd=fd)
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
        return fd
    except OSError as exc:
        os.close(fd)
        raise AgentFileError(f"{here}: {_describe(exc)}") from None
    except BaseException:
        os.close(fd)
        raise


def _split(relative: str | os.PathLike[str]) -> tuple[str, str]:
    parts = _parts(relative)
    return "/".join(parts[:-1]), parts[-1]


def write_file(root: Path, relative: str | os.PathLike[str], data: bytes, *, mode: int = 0o600) -> None:
    """Write `data` to `root/relative` without following a link: a fresh name, then a rename over it.

    Missing parent folders are made (0700)."""
    folder, name = _split(relative)
    dir_fd = open_folder(root, folder, create=True)
    tmp = f".{name}.{secrets.token_hex(6)}.tmp"
    try:
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
        except OSError as exc:
            raise AgentFileError(f"{root / relative}: cannot create: {_describe(exc)}") from None
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            if exc.errno == errno.EISDIR or exc.errno == errno.ENOTEMPTY:
                raise AgentFileError(f"{root / relative}: a folder stands where a file should be") from None
            raise AgentFileError(f"{root / relative}: cannot write: {_describe(exc)}") from None
    finally:
        os.close(dir_fd)


def read_file(root: Path, relative: str | os.PathLike[str], *, max_bytes: int) -> bytes:
    """The bytes of the regular file `root/relative`, refused when larger than `max_bytes` (from `fstat`,
    before anything is read), when it is a link, a fifo, a device or a folder."""
    return _read(root, relative, max_bytes, refuse_larger=True)


def read_head(root: Path, relative: str | os.PathLike[str], *, max_bytes: int) -> bytes:
    """At most the first `max_bytes` bytes of the regular file `root/relative` (a larger file is not
    refused: the caller needs only its head, e.g. a SKILL.md's front matter); refused as `read_file`
    when it is a link, a fifo, a device or a folder."""
    return _read(root, relative, max_bytes, refuse_larger=False)


def _read(root: Path, relative: str | os.PathLike[str], max_bytes: int, *, refuse_larger: bool) -> bytes:
    folder, name = _split(relative)
    dir_fd = open_folder(root, folder)
    try:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
        except FileNotFoundError:
            raise AgentFileError(f"{root / relative}: no such file") from None
        except OSError as exc:
            raise AgentFileError(f"{root / relative}: {_describe(exc)}") from None
    finally:
        os.close(dir_fd)
    with os.fdopen(fd, "rb") as src:
        st = os.fstat(src.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise AgentFileError(f"{root / relative}: not a regular file")
        if refuse_larger and st.st_size > max_bytes:
            raise AgentFileError(f"{root / relative}: {st.st_size} bytes, over the {max_bytes}-byte limit")
        data = src.read(max_bytes + 1)  # a file grown since the fstat is still capped
    if not refuse_larger:
        return data[:max_bytes]
    if len(data) > max_bytes:
        raise AgentFileError(f"{root / relative}: over the {max_bytes}-byte limit")
    return data


def make_folder(root: Path, relative: str | os.PathLike[str], *, mode: int = 0o700) -> Path:
    """Make sure `root/relative` is a folder (made if missing), never through a link; return its path.

    A file (or link) standing there raises `AgentFileError`: the caller decides whether to set it aside."""
    os.close(open_folder(root, relative, create=True, mode=mode))
    return root / relative


def set_aside(path: Path) -> Path:
    """Rename whatever stands at `path` (a file where a folder should be, a link) to a fresh sibling name
    and return that name, so the driver can make what it needs there. Nothing is followed or deleted."""
    aside = path.with_name(f"{path.name}.set-aside-{secrets.token_hex(4)}")
    try:
        os.rename(path, aside)
    except OSError as exc:
        raise AgentFileError(f"{path}: cannot set it aside: {_describe(exc)}") from None
    return aside
