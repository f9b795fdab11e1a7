"""Read the one-time boot payload (PROTOCOL §1).

Order matters: open without following links, check ownership and mode on the open descriptor (no race
with a swap of the path), read at most 1 MiB + 1 byte, unlink BEFORE parsing so an invalid payload is
gone too, then validate. Every failure is a `BootError` whose message names the problem or the field
and never contains a value from the file.
"""

from __future__ import annotations

import os
import re
import stat

import msgspec

from driver.protocol.boot import BOOT_DECODER, OWN_MESSAGES, BootPayload

MAX_BOOT_BYTES = 1024 * 1024
ENV_BOOT_FILE = "AGENT_DRIVER_BOOT_FILE"
EX_CONFIG = 78
ALLOWED_MODES = (0o600, 0o400)
# Said after every refusal of a payload that was read: the driver has already deleted it (PROTOCOL §1
# unlinks before parsing), so a rerun would only find nothing. The reference control plane's minting
# command is the example; any control plane's own minting does the same.
MINT_AGAIN = (
    "the payload file is deleted (a payload is single-use): mint a new one (mode 0600), "
    "e.g. `agent-driver controlplane boot --out PATH ...`"
)
NOT_FOUND_HINT = (
    "a payload is single-use and the driver deletes it as it starts, so a second run finds nothing: "
    "mint a new one, e.g. `agent-driver controlplane boot --out PATH ...`"
)


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


def _open(path: str) -> int:
    try:
        return os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise BootError(f"boot: payload file not found: {path} ({NOT_FOUND_HINT})") from None
    except OSError as exc:
        if os.path.islink(path):
            raise BootError(f"boot: payload file is a symlink, refused: {path}") from None
        raise BootError(f"boot: cannot open payload file {path}: {exc.strerror}") from None


def _read_checked(fd: int, path: str) -> bytes:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise BootError(f"boot: payload is not a regular file: {path}")
    if st.st_uid != os.geteuid():
        raise BootError(f"boot: payload file is owned by uid {st.st_uid}, not the driver's uid {os.geteuid()}")
    mode = stat.S_IMODE(st.st_mode)
    if mode not in ALLOWED_MODES:
        # Exactly 0600 or 0400: an execute bit, a missing read bit or a setuid/sticky bit is as
        # suspicious as a group or other bit (PROTOCOL §1).
        raise BootError(f"boot: payload file mode {mode:04o} is refused (must be 0600 or 0400)")
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


def _zero(fd: int) -> bool:
    """Overwrite the file behind `fd` (the one we opened and judged, not whatever the path names now)
    with zeros; True if the bytes were overwritten and fsync'd. The read-only descriptor is reopened
    for writing through /proc/self/fd, after making a 0400 file writable by its owner."""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return False
        if not stat.S_IMODE(st.st_mode) & stat.S_IWUSR:
            os.fchmod(fd, stat.S_IMODE(st.st_mode) | stat.S_IWUSR)
        wfd = os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_CLOEXEC)
        try:
            size = os.fstat(wfd).st_size
            block = bytes(65536)
            written = 0
            while written < size:
                written += os.pwrite(wfd, block[: min(len(block), size - written)], written)
            os.fsync(wfd)
        finally:
            os.close(wfd)
        return True
    except OSError:
        return False


def _destroy(path: str, fd: int) -> bool:
    """Unlink the payload path (for a symlink: the link, never its target); True if it was unlinked.

    If unlinking fails, the file we opened is overwritten with zeros, whether it was accepted or
    refused for its mode, owner or size, and the driver exits 1: the sandbox is at fault, not the payload.
    """
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False
    except OSError as exc:
        reason = exc.strerror
    if fd >= 0 and _zero(fd):
        raise BootError(f"boot: cannot unlink payload file {path} ({reason}); its content was overwritten", 1)
    raise BootError(f"boot: cannot unlink payload file {path} ({reason}) nor overwrite it", 1)


def parse_payload(data: bytes) -> BootPayload:
    try:
        return BOOT_DECODER.decode(data)
    except msgspec.ValidationError as exc:
        raise BootError(f"boot: invalid payload: {_describe(exc)}") from None
    except msgspec.DecodeError as exc:
        raise BootError(f"boot: payload is not valid JSON: {_describe(exc)}") from None
    except RecursionError:
        raise BootError("boot: invalid payload: JSON nested too deeply") from None


# msgspec's messages that carry no value from the input: the expectation comes from the schema.
_SAFE_MESSAGE = re.compile(
    r"^(Expected `[^`]*`[^'\"]*|Object missing required field `[A-Za-z0-9_]+`|JSON is malformed: [a-z ]+"
    r"|Input data was truncated|Integer value out of range|Number out of range)"
)
_UNKNOWN_FIELD = re.compile(r"^Object contains unknown field `([A-Za-z0-9_]{1,64})`$")
_MISSING_FIELD = re.compile(r"^Object missing required field `([A-Za-z0-9_]+)`$")


def _describe(exc: Exception) -> str:
    """One line naming the field path and the expectation, never a value from the payload.

    msgspec's own text may echo a value (`Invalid enum value 'x' - at ...`), so it is not printed as is:
    only the path, and the part of the message known to come from the schema, survive.
    """
    text = str(exc)
    if text in OWN_MESSAGES:
        return text  # our own cross-field checks (`__post_init__`) have fixed messages naming the fields
    message, _, where = text.partition(" - at `")
    path = where.rstrip("`")
    path = "" if path in ("", "$") else path.removeprefix("$.")
    at = f"in `{path}`" if path else "at the top level"
    if (m := _UNKNOWN_FIELD.match(message)) is not None:
        return _unknown(m.group(1), path, at)
    if (m := _MISSING_FIELD.match(message)) is not None:
        return f"missing required field `{m.group(1)}` {at}"
    if message.startswith("Object contains unknown field"):
        return f"unknown field {at}"
    if message.startswith("Invalid enum value"):
        return f"`{path}` has a value that is not allowed" if path else "a value is not allowed"
    if _SAFE_MESSAGE.match(message):
        return f"{message} - at `{path}`" if path else message
    return f"`{path}` is invalid" if path else "the payload does not match the schema (PROTOCOL §1)"


def _unknown(name: str, path: str, at: str) -> str:
    """`unknown field `sesion` at the top level (did you mean `session`?)`: the name is the typo's own
    (a field name, [A-Za-z0-9_], never a value), the suggestion one of the schema's names."""
    from driver.protocol.boot import BootPayload
    from driver.protocol.boot_fields import suggestion

    meant = suggestion(BootPayload, path, name)
    return f"unknown field `{name}` {at}" + (f" (did you mean `{meant}`?)" if meant else "")


def read_boot_payload(path: str) -> BootPayload:
    """Read, destroy, then validate. The path is removed whatever went wrong, so a rejected payload
    (wrong mode, wrong owner, too large, invalid) does not linger with a secret in it; its refusal
    then says so, and that a new one must be minted."""
    fd = -1
    removed = False
    try:
        try:
            fd = _open(path)
            data = _read_checked(fd, path)
        finally:
            try:
                removed = _destroy(path, fd)
            finally:
                if fd >= 0:
                    os.close(fd)
        return parse_payload(data)
    except BootError as exc:
        if removed and exc.exit_code == EX_CONFIG:
            raise BootError(f"{exc}; {MINT_AGAIN}") from None
        raise


def load(cli_path: str | None) -> BootPayload:
    return read_boot_payload(resolve_boot_path(cli_path))
