"""Read the one-time boot payload (PROTOCOL §1).

Order matters: open without following links, check ownership and mode on the open descriptor (no race
with a swap of the path), read at most 1 MiB + 1 byte, unlink BEFORE parsing so an invalid payload is
gone too, then validate. Every failure is a `BootError` whose message names the problem or the field
and never contains a value from the file.
"""

from __future__ import annotations

import os
import stat

import msgspec

from driver.protocol.boot import BOOT_DECODER, BootPayload

MAX_BOOT_BYTES = 1024 * 1024
ENV_BOOT_FILE = "AGENT_DRIVER_BOOT_FILE"
EX_CONFIG = 78


class BootError(Exception):
    """The payload cannot be used. `exit_code` is 78 except when the file could not be destroyed."""

    def __init__(self, message: str, exit_code: int = EX_CONFIG) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def resolve_boot_path(cli_path: str | None) -> str:
    path = cli_path or os.environ.get(ENV_BOOT_FILE)
    # The variable is ours alone: drop it so no child process ever learns where the payload was.
    os.environ.pop(ENV_BOOT_FILE, None)
    if not path:
        raise BootError(f"boot: no payload given (use --boot-file PATH or {ENV_BOOT_FILE})")
    return path


def _read_checked(path: str) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise BootError(f"boot: payload file not found: {path}") from None
    except OSError as exc:
        if os.path.islink(path):
            raise BootError(f"boot: payload file is a symlink, refused: {path}") from None
        raise BootError(f"boot: cannot open payload file {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BootError(f"boot: payload is not a regular file: {path}")
        if st.st_uid != os.geteuid():
            raise BootError(
                f"boot: payload file is owned by uid {st.st_uid}, not the driver's uid {os.geteuid()}"
            )
        if st.st_mode & 0o077:
            raise BootError(
                f"boot: payload file mode {stat.S_IMODE(st.st_mode):04o} is open to group or others "
                "(must be 0600 or 0400)"
            )
        if st.st_size > MAX_BOOT_BYTES:
            raise BootError(f"boot: payload file is {st.st_size} bytes, over the 1 MiB limit")
        chunks: list[bytes] = []
        remaining = MAX_BOOT_BYTES + 1
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 65536))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        data = b"".join(chunks)
        if len(data) > MAX_BOOT_BYTES:
            raise BootError("boot: payload file is over the 1 MiB limit")
        return data
    finally:
        os.close(fd)


def _destroy(path: str, *, zero_on_failure: bool) -> None:
    """Unlink the payload path (for a symlink: the link, never its target).

    If unlinking fails, a payload we read is overwritten with zeros and the driver exits non-zero.
    """
    try:
        os.unlink(path)
        return
    except FileNotFoundError:
        return
    except OSError as exc:
        reason = exc.strerror
    if zero_on_failure:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                os.write(fd, b"\0" * os.fstat(fd).st_size)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:
            pass
    raise BootError(f"boot: cannot unlink payload file {path} ({reason}); its content was overwritten", 1)


def parse_payload(data: bytes) -> BootPayload:
    try:
        return BOOT_DECODER.decode(data)
    except msgspec.ValidationError as exc:
        raise BootError(f"boot: invalid payload: {_describe(exc)}") from None
    except msgspec.DecodeError as exc:
        raise BootError(f"boot: payload is not valid JSON: {_describe(exc)}") from None


def _describe(exc: Exception) -> str:
    # msgspec messages name the path (`$.control.url`) and the expected type, never the value; keep
    # them, minus the `$.` prefix, so the line names the field as the payload spells it.
    return str(exc).replace("`$.", "`").replace("`$`", "`(root)`")


def read_boot_payload(path: str) -> BootPayload:
    """Read, destroy, then validate. The path is removed whatever went wrong, so a rejected payload
    (wrong mode, wrong owner, too large, invalid) does not linger with a secret in it."""
    data: bytes | None = None
    try:
        data = _read_checked(path)
    finally:
        _destroy(path, zero_on_failure=data is not None)
    return parse_payload(data)


def load(cli_path: str | None) -> BootPayload:
    return read_boot_payload(resolve_boot_path(cli_path))
