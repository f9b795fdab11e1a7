"""A provider process held by a keeper (driver/keeper/keeper.py, PROTOCOL §8.2), seen from the driver.

`KeptProcess` has the surface the adapters use from `driver.adapters.common.process.ProviderProcess` (stdin
send stream, stdout receive stream, pid/pgid, `exited`, `wait`, `signal_group`, `terminate`,
`stderr_tail`), over the keeper's Unix socket. `spawn()` starts a keeper (driver/keeper/launch.py)
and through it the provider, in a PID namespace of its own that does not die with this driver;
`attach()` connects a new driver
process to a keeper a dead one left, and streams the provider's output from an offset of the log.

Files, all under `state_dir/driver/keeper/` (hidden from the provider tree, §9): `sock`, `out.log`,
`in.log`, and those of `driver.keeper.state` (`record.json`, `turn.json`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import signal
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
from anyio.streams.buffered import BufferedByteReceiveStream

from driver import logs
from driver.keeper import launch as keeper_launch
from driver.keeper.launch import CONNECT_TIMEOUT_S, KEEPER_PY, supported
from driver.keeper.state import (
    KeeperError,
    Record,
    Turn,
    children,
    discard,
    keeper_dir,
    log_full,
    read_record,
    read_turn,
    socket_address,
    stdin_facts,
    write_json,
    zombie,
)

log = logs.get(__name__)

__all__ = [
    "KEEPER_PY",
    "KeeperError",
    "KeptProcess",
    "Record",
    "Turn",
    "discard",
    "keeper_dir",
    "read_record",
    "read_turn",
    "stdin_facts",
    "supported",
]

HEADER = struct.Struct(">BI")
_MAX_TAIL_LINES = 200
LOG_MAX_BYTES = 512 * 1024 * 1024  # each of the keeper's logs (AGENT_DRIVER_KEEPER_LOG_BYTES: tests)


def _log_max_bytes() -> int:
    raw = os.environ.get("AGENT_DRIVER_KEEPER_LOG_BYTES", "")
    return int(raw) if raw.isdigit() and 0 < int(raw) <= LOG_MAX_BYTES else LOG_MAX_BYTES


class _Stdin(anyio.abc.ByteSendStream):
    def __init__(self, owner: KeptProcess) -> None:
        self._owner = owner

    async def send(self, item: bytes) -> None:
        await self._owner._send(b"I", item)
        self._owner.in_size += len(item)

    async def send_eof(self) -> None:
        await self._owner._send(b"E")

    async def aclose(self) -> None:
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            await self._owner._send(b"E")


class _Stdout(anyio.abc.ByteReceiveStream):
    def __init__(self, owner: KeptProcess, receive: anyio.abc.ObjectReceiveStream[bytes]) -> None:
        self._owner = owner
        self._receive = receive

    async def receive(self, max_bytes: int = 65536) -> bytes:
        await self._owner._unless_detached()
        try:
            chunk = await self._receive.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise anyio.EndOfStream from None
        await self._owner._unless_detached()  # the successor reads this chunk again, from the log
        self._owner._delivered(chunk)
        return chunk

    async def aclose(self) -> None:
        await self._receive.aclose()


class KeptProcess:
    pid: int
    pgid: int

    def __init__(
        self,
        state_dir: Path,
        stream: anyio.abc.SocketStream,
        reader: BufferedByteReceiveStream,
        record: Record,
        hello: dict[str, Any],
    ) -> None:
        self.state_dir = state_dir
        self.name = "kept"
        self._stream = stream
        self._reader = reader
        self.record = record
        self.attach_end = int(hello.get("out_size", 0))
        self.in_size = int(hello.get("in_size", 0))  # bytes in the input log, ours included
        self.consumed = 0
        self.line_end = 0
        self.returncode_raw: int | None = None
        self.exited = anyio.Event()
        self._lock = anyio.Lock()
        self._lines: collections.deque[str] = collections.deque(maxlen=_MAX_TAIL_LINES)
        self._partial = ""
        self._terminated = False
        self._detached = False
        self._bwrap: anyio.abc.Process | None = None
        # The turn marked last (by this process, or the predecessor's when attached to continue it).
        self.turn: Turn | None = None
        send, receive = anyio.create_memory_object_stream[bytes](64)
        self._out_send = send
        self.stdin: anyio.abc.ByteSendStream = _Stdin(self)
        self.stdout: anyio.abc.ByteReceiveStream = _Stdout(self, receive)
        provider = children(record.keeper_pid)
        self.pid = provider[0] if provider else record.keeper_pid
        # The provider called setsid() in the keeper: its group id is its (outer) pid.
        self.pgid = self.pid
        self._task = asyncio.get_running_loop().create_task(self._read(), name="kept-reader")

    # -- starting ----------------------------------------------------------------------------------

    @classmethod
    async def spawn(
        cls,
        argv: list[str],
        *,
        env: Mapping[str, str],
        cwd: str | Path,
        state_dir: Path,
        runtime: str,
        grace_ms: int,
        log_max_bytes: int | None = None,
    ) -> KeptProcess:
        if log_max_bytes is None:
            log_max_bytes = _log_max_bytes()
        bwrap, record = await keeper_launch.launch(
            argv, env=env, cwd=cwd, state_dir=state_dir, runtime=runtime, grace_ms=grace_ms, log_max_bytes=log_max_bytes
        )
        self = await cls.attach(state_dir, record, offset=0)
        self._bwrap = bwrap
        log.info("keeper.started", keeper_pid=record.keeper_pid, provider_pid=self.pid)
        return self

    @classmethod
    async def attach(cls, state_dir: Path, record: Record, *, offset: int | None) -> KeptProcess:
        """Connect and authenticate; stream output from `offset` (None: from the log's end)."""
        if not record.alive():
            raise KeeperError("the recorded keeper is not running")
        try:
            with anyio.fail_after(CONNECT_TIMEOUT_S):
                with socket_address(state_dir) as address:
                    stream = await anyio.connect_unix(address)
                reader = BufferedByteReceiveStream(stream)
                await stream.send(HEADER.pack(ord("A"), 32) + bytes.fromhex(record.secret))
                kind, payload = await _read_frame(reader)
        except (
            OSError,
            TimeoutError,
            anyio.EndOfStream,
            anyio.IncompleteRead,
            anyio.BrokenResourceError,
            ValueError,
        ) as exc:
            raise KeeperError(f"cannot reach the keeper: {type(exc).__name__}") from None
        if kind != ord("H"):
            await stream.aclose()
            raise KeeperError(f"the keeper refused: {payload[:200].decode(errors='replace')}")
        hello = json.loads(payload)
        full = "in" if hello.get("in_full") else "out" if hello.get("full") else None
        if offset != 0 and full is not None:
            # A predecessor's keeper whose log is incomplete: its facts cannot be trusted (PROTOCOL §8.2).
            await stream.aclose()
            log_full(full, int(hello.get("limit", 0) or 0), refused=True)
            raise KeeperError(f"the keeper's {full} log filled up: it cannot be reattached")
        self = cls(state_dir, stream, reader, record, hello)
        start = self.attach_end if offset is None else offset
        self.consumed = self.line_end = start
        # No chunk may straddle the log's end at hello: what is re-read and what is new stay apart.
        await self._send(b"R", struct.pack(">QQ", start, self.attach_end))
        return self

    # -- the socket ----------------------------------------------------------------------------------

    async def _unless_detached(self) -> None:
        if self._detached:
            await anyio.sleep_forever()

    async def _send(self, kind: bytes, payload: bytes = b"") -> None:
        await self._unless_detached()
        async with self._lock:
            try:
                await self._stream.send(HEADER.pack(kind[0], len(payload)) + payload)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
                raise anyio.BrokenResourceError from exc

    async def _read(self) -> None:
        try:
            while True:
                kind, payload = await _read_frame(self._reader)
                if kind == ord("O"):
                    await self._out_send.send(payload)
                elif kind == ord("X"):
                    self._add_stderr(payload)
                elif kind == ord("Z"):
                    self.returncode_raw = int(json.loads(payload).get("status", -9))
                elif kind == ord("W"):
                    full = json.loads(payload)
                    log.warning("keeper.log_full", log=full.get("log"), limit=full.get("limit"))
                    log_full(str(full.get("log")), int(full.get("limit", 0)), refused=False)
                elif kind == ord("F"):
                    log.warning("keeper.refused", reason=payload[:200].decode(errors="replace"))
                    break
        except (
            anyio.EndOfStream,
            anyio.IncompleteRead,
            anyio.BrokenResourceError,
            anyio.ClosedResourceError,
            OSError,
            ValueError,
        ):
            pass
        finally:
            # Handed over: nothing here may look like the provider ending.
            if not self._detached:
                if self.returncode_raw is None:
                    self.returncode_raw = -signal.SIGKILL  # the keeper went away without a word
                self._out_send.close()
                self.exited.set()

    def _delivered(self, chunk: bytes) -> None:
        start = self.consumed
        self.consumed += len(chunk)
        newline = chunk.rfind(b"\n")
        if newline >= 0:
            self.line_end = start + newline + 1

    def past_attach(self) -> bool:
        """Whether what is being read now was written after this driver attached."""
        return self.consumed > self.attach_end

    def mark_turn(self, run_id: str | None, thread_id: str, extra: dict[str, Any] | None = None) -> None:
        """Record the run in flight and the line boundary its turn's output starts after."""
        self.turn = Turn(run_id, thread_id, self.line_end, self.in_size, dict(extra or {}))
        self._write_turn(self.turn)

    def update_turn(self, extra: dict[str, Any]) -> None:
        """Rewrite the marked turn's adapter facts (`extra`, merged), its offsets as they were."""
        turn = self.turn
        if turn is None:
            return
        self.turn = Turn(turn.run_id, turn.thread_id, turn.offset, turn.in_offset, {**turn.extra, **extra})
        self._write_turn(self.turn)

    def _write_turn(self, turn: Turn) -> None:
        value: dict[str, Any] = {
            "run_id": turn.run_id,
            "thread_id": turn.thread_id,
            "offset": turn.offset,
            "in_offset": turn.in_offset,
        }
        if turn.extra:
            value["extra"] = turn.extra
        write_json(keeper_dir(self.state_dir) / "turn.json", value)

    def _add_stderr(self, data: bytes) -> None:
        text = self._partial + data.decode(errors="replace")
        *complete, self._partial = text.split("\n")
        for line in complete:
            self._lines.append(logs.redact(line)[:4096])

    def stderr_tail(self, max_chars: int = 4000) -> str:
        out: list[str] = []
        total = 0
        for line in reversed(self._lines):
            total += len(line) + 1
            if total > max_chars:
                break
            out.append(line)
        return "\n".join(reversed(out))

    # -- the process's life --------------------------------------------------------------------------

    @property
    def returncode(self) -> int | None:
        return self.returncode_raw if self.exited.is_set() else None

    async def wait(self) -> int:
        await self.exited.wait()
        assert self.returncode_raw is not None
        return self.returncode_raw

    def group_ids(self) -> list[int]:
        """The groups the kernel signals: the provider's (SIGTERM reaches it) and the keeper's bwrap,
        whose SIGKILL goes to the namespace's pid 1, the keeper (`containment.kill_group`), and so ends
        every process in the namespace, those that left the provider's group included."""
        return [self.pgid, self.record.bwrap_pid] if self.record.alive() else [self.pgid]

    def signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, sig)

    async def terminate(self, grace: float = 3.0) -> int:
        """End the provider tree through the keeper (TERM, KILL after its 3 s), then the keeper."""
        with anyio.CancelScope(shield=True):
            if not self._terminated:
                self._terminated = True
                with contextlib.suppress(anyio.BrokenResourceError):
                    await self._send(b"T")
                with anyio.move_on_after(grace + 5.0):
                    await self.exited.wait()
                # Its socket closes as it exits, a moment before it is a zombie: give it that moment.
                with anyio.move_on_after(2.0):
                    while self.record.alive() and not zombie(self.record.keeper_pid):  # noqa: ASYNC110
                        await anyio.sleep(0.01)
                if self.record.alive() and not zombie(self.record.keeper_pid):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(self.record.keeper_pid, signal.SIGKILL)
                discard(self.state_dir)
            code = await self.wait()
            if self._bwrap is not None:
                with anyio.move_on_after(5.0):
                    await self._bwrap.wait()
            self._task.cancel()
            with contextlib.suppress(Exception):
                await self._stream.aclose()
        return code

    def detach(self) -> None:
        """Leave the keeper running for a successor (the handover): from now on nothing is read or
        written, and nothing ends; the connection closes with this process."""
        self._terminated = True
        self._detached = True


async def _read_frame(stream: BufferedByteReceiveStream) -> tuple[int, bytes]:
    kind, size = HEADER.unpack(await stream.receive_exactly(HEADER.size))
    if size > 16 * 1024 * 1024:
        raise ValueError("frame too large")
    return kind, await stream.receive_exactly(size) if size else b""
