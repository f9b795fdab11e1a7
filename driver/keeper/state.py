"""What a keeper leaves under `state_dir/driver/keeper/` for the next driver process (PROTOCOL §8.2):
`record.json` (the keeper's pid and start time, its bwrap's pid, the runtime, the nonce its secret is
derived from, the fingerprint of what configured the provider), `turn.json`
(the run in flight, its thread, the output and input log offsets its turn started at), and reading the
input log; and ending a recorded keeper. No I/O beyond these files and /proc.

Both files carry a MAC (HMAC-SHA256 under the journal's key, driver/queue/rowmac.py), like
`processes.json` (driver/containment/wrapper.py): a file the driver did not write (an agent naming any same-uid
pid as the keeper, or pointing a successor at other output) is not acted on, and is reported.

No secret is persisted: the secret a driver authenticates to its keeper with is the HMAC of the
record's nonce under the journal's key (`Record.secret`), which only a driver holding the control
token can compute; the keeper got it on stdin. The fingerprint (`fingerprint`) is a keyed hash of the
boot payload's part that configured the provider: a successor whose payload differs does not adopt the
kept provider (driver/keeper/reattach.py).
"""

from __future__ import annotations

import contextlib
import hmac
import json
import os
import signal
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from driver import agent_files, containment
from driver.queue.rowmac import UNKEYED, RowMac

if TYPE_CHECKING:
    from driver.protocol.boot import BootPayload

# The journal's key, set once by the CLI (`use_mac`) before any keeper is started or looked for.
_mac: RowMac = UNKEYED
_configured: bytes = b""  # what configured the provider (`use_payload`), canonical JSON


def use_mac(mac: RowMac) -> None:
    global _mac
    _mac = mac


# Fields of `execution` that do not configure the provider: how this process recovers a session, not
# what the provider is. Everything else (runtime, agent command and env, model, system prompt,
# permission policy, environment and its keys, provider options and upstreams, MCP servers, host
# tools, skills, model proxy secrets and budgets, limits, revision) is in the fingerprint.
_NOT_CONFIGURATION = ("native_resume", "recovery_messages", "native_checkpoint")
_SESSION_FIELDS = ("cwd", "memory_dir", "additional_directories", "network")


def use_payload(payload: BootPayload) -> None:
    """Remember what configured the provider of this boot payload (PROTOCOL §8.2), for `fingerprint`."""
    global _configured
    execution = msgspec.to_builtins(payload.execution)
    for name in _NOT_CONFIGURATION:
        execution.pop(name, None)
    session = msgspec.to_builtins(payload.session)
    _configured = _canonical(
        {"execution": execution, "session": {k: session.get(k) for k in _SESSION_FIELDS if k in session}}
    )


def fingerprint() -> str:
    """A keyed hash of what configured the provider (never the values: the environment holds keys)."""
    return _mac.of("keeper_payload", _configured).hex()


def keyed(purpose: str, value: str) -> str:
    """A keyed digest of `value` (under the journal's key): what a keeper file records of a credential
    the provider holds, so the file says nothing a reader could present (driver/model_proxy/kept.py)."""
    return _mac.of("keeper_keyed", purpose, value).hex()


def _mac_of(name: str, body: bytes) -> str:
    return _mac.of("keeper", name, body).hex()


_notices: list[dict[str, Any]] = []


def notice(payload: dict[str, Any]) -> None:
    """A `diagnostic.reported` payload about a keeper, for the kernel to send (`take_notices`)."""
    _notices.append(payload)


def take_notices() -> list[dict[str, Any]]:
    out = list(_notices)
    _notices.clear()
    return out


def log_full(log: str, limit: int, *, refused: bool) -> None:
    """Say that a keeper's log filled up (PROTOCOL §8.2): from there on a successor cannot reattach."""
    which = "input" if log == "in" else "output"
    then = "so this provider was not adopted" if refused else "a driver restart will end the run driver.restarted"
    notice(
        {
            "code": "keeper.log_full",
            "severity": "warning",
            "message": f"the keeper's {which} log reached its {limit}-byte bound; {then}",
            "details": {"log": log, "limit": limit, "refused": refused},
        }
    )


class KeeperError(Exception):
    """The keeper cannot be started or reached, refused us, or is not the one recorded."""


def keeper_dir(state_dir: Path) -> Path:
    return state_dir / "driver" / "keeper"


# sun_path holds 108 bytes with its NUL; bind() and connect() fail "AF_UNIX path too long" past it.
_SUN_PATH_MAX = 107


@contextlib.contextmanager
def socket_address(state_dir: Path) -> Iterator[str]:
    """The keeper's socket path as bind() and connect() take it, valid inside the block. A deep
    `state_dir` (a control plane's mktemp tree) passes sun_path's limit, so a longer path is reached
    through an O_PATH descriptor of its folder: `/proc/self/fd/N/sock` names the same file in under 30
    bytes, and keeps the socket where §9 hides it."""
    path = keeper_dir(state_dir) / "sock"
    if len(os.fsencode(path)) <= _SUN_PATH_MAX:
        yield str(path)
        return
    fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{fd}/sock"
    finally:
        os.close(fd)


@dataclass(frozen=True, slots=True)
class Record:
    bwrap_pid: int
    keeper_pid: int
    keeper_start: int
    nonce: str  # the secret is derived from it (`secret`): the record holds no secret
    runtime: str
    fingerprint: str  # of what configured the provider (`fingerprint()` when it was started)

    @property
    def secret(self) -> str:
        """What the driver authenticates to the keeper with: only a holder of the journal key derives it."""
        return _mac.of("keeper_secret", self.nonce).hex()

    def alive(self) -> bool:
        return containment.start_time(self.keeper_pid) == self.keeper_start


@dataclass(frozen=True, slots=True)
class Turn:
    run_id: str | None
    thread_id: str
    offset: int
    in_offset: int = 0  # the input log's size when the turn was marked, just before its turn/start
    # What else the adapter's successor needs, the adapter's own (ACP: its initialize answer, the
    # session's cost and state before the turn: driver/adapters/acp/reattach.py).
    extra: dict[str, Any] = field(default_factory=dict)


# The largest file read here. A record or host.json is a few hundred bytes; a turn.json's `extra` holds
# an ACP agent's initialize answer and the run's instructions (a boot payload is at most 1 MiB).
MAX_FILE_BYTES = 16 * 1024 * 1024


def _bounded_bytes(path: Path) -> bytes | None:
    """The file's bytes, or None when it is no regular file of at most MAX_FILE_BYTES. Every start reads
    the record, and where the driver's state is visible (`containment.degraded`) the agent may have put
    a fifo there (a plain read blocks for good) or a sparse giant (read whole before its MAC is checked).
    Raises FileNotFoundError when there is none."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_FILE_BYTES:
            return None
        data = f.read(MAX_FILE_BYTES + 1)  # grown since the fstat: still capped
    return data if len(data) <= MAX_FILE_BYTES else None


def read_json(path: Path) -> Any:
    """The file's value when it is the driver's own (its MAC checks); None when absent or not."""
    try:
        raw = _bounded_bytes(path)
        data = json.loads(raw) if raw is not None else None
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError):
        data = None
    body = data.get("value") if isinstance(data, dict) else None
    mac = data.get("mac") if isinstance(data, dict) else None
    if not isinstance(mac, str) or not hmac.compare_digest(mac, _mac_of(path.name, _canonical(body))):
        containment.report("keeper", path.name, "mac")
        return None
    return body


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def read_record(state_dir: Path) -> Record | None:
    try:
        raw = read_json(keeper_dir(state_dir) / "record.json")
        return Record(**{k: raw[k] for k in Record.__slots__})  # type: ignore[attr-defined]
    except (ValueError, KeyError, TypeError):
        return None


def read_turn(state_dir: Path) -> Turn | None:
    try:
        raw = read_json(keeper_dir(state_dir) / "turn.json")
        run_id = raw["run_id"]
        run = run_id if isinstance(run_id, str) else None
        extra = raw.get("extra")
        return Turn(
            run,
            str(raw["thread_id"]),
            int(raw["offset"]),
            int(raw.get("in_offset", 0)),
            extra if isinstance(extra, dict) else {},
        )
    except (ValueError, KeyError, TypeError):
        return None


def write_json(path: Path, value: dict[str, Any]) -> None:
    """Write a MAC'd record (0600) through a fresh `O_EXCL|O_NOFOLLOW` name and a rename: a link planted
    in the keeper's folder (it is visible where containment is degraded) is replaced, never written
    through. Raises OSError, as the callers expect of a write."""
    # No fsync: these files serve a driver crash, which leaves the page cache intact.
    data = json.dumps({"value": value, "mac": _mac_of(path.name, _canonical(value))}).encode()
    try:
        agent_files.write_file(path.parent, path.name, data, mode=0o600)
    except agent_files.AgentFileError as exc:
        raise OSError(str(exc)) from None


def discard(state_dir: Path) -> bool:
    """End a recorded keeper (verified by its start time) and forget it: its namespace dies with it."""
    record = read_record(state_dir)
    killed = False
    if record is not None and record.alive():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(record.keeper_pid, signal.SIGKILL)
            killed = True
    for name in ("record.json", "turn.json", "host.json", "proxy.json"):
        with contextlib.suppress(OSError):
            (keeper_dir(state_dir) / name).unlink()
    return killed


def stdin_facts(state_dir: Path) -> tuple[int, set[Any]]:
    """From the input log: the first request id a new driver may use (above every id a predecessor
    sent), and the ids of the provider's requests a predecessor already answered."""
    next_id, answered = 0, set()
    try:
        log_file = (keeper_dir(state_dir) / "in.log").open("rb")
    except OSError:
        return 0, set()
    with log_file:  # one line at a time: the log may hold 512 MiB (a file's content the agent had read)
        for line in log_file:
            if b'"id"' not in line:
                continue
            try:
                msg = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if not isinstance(msg, dict) or "id" not in msg:
                continue
            if "method" in msg:
                if isinstance(msg["id"], int):
                    next_id = max(next_id, msg["id"] + 1)
            elif ("result" in msg or "error" in msg) and isinstance(msg["id"], int | str):
                answered.add(msg["id"])
    return next_id, answered


def _input_messages(state_dir: Path, offset: int, needle: bytes) -> Iterator[dict[str, Any]]:
    """The JSON objects the input log holds from `offset`, among its lines containing `needle`, one at
    a time: the log may hold 512 MiB, and the callers keep only a little of each."""
    try:
        log_file = (keeper_dir(state_dir) / "in.log").open("rb")
    except OSError:
        return
    with log_file:
        log_file.seek(offset)
        for line in log_file:
            if needle not in line:
                continue
            try:
                msg = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if isinstance(msg, dict):
                yield msg


def requests_since(state_dir: Path, offset: int, method: str) -> list[int]:
    """The ids, in order, of the `method` requests a driver wrote to the provider from `offset` of
    the input log on (ACP: the `session/prompt`s of the run in flight, whose answers end its turns)."""
    needle = json.dumps(method).encode()
    return [
        msg["id"]
        for msg in _input_messages(state_dir, offset, needle)
        if msg.get("method") == method and isinstance(msg.get("id"), int) and not isinstance(msg["id"], bool)
    ]


def replies(state_dir: Path) -> dict[Any, dict[str, Any] | None]:
    """How a driver answered the provider's requests, by request id: the result when it is an object
    holding `outcome` (ACP: a permission's answer), `{}` for any other result, None for an error. Other
    results are not kept (a file's content may be large, and is not needed again)."""
    out: dict[Any, dict[str, Any] | None] = {}
    for msg in _input_messages(state_dir, 0, b'"id"'):
        rid = msg.get("id")
        if "method" in msg or not isinstance(rid, int | str):
            continue
        result = msg.get("result")
        if "error" in msg:
            out[rid] = None
        elif isinstance(result, dict) and "outcome" in result:
            out[rid] = result
        else:
            out[rid] = {}
    return out


def zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return False


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []
