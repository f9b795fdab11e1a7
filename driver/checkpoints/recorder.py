"""The kernel's checkpoint room: after every run's terminal and at `session.stop`, the current native
session's files go out as `checkpoint.file` chunks and one `checkpoint.recorded` (PROTOCOL §8.1).

Every event goes through the outbox (lossless, journaled before it is sent), so a checkpoint survives
a lost link and a driver restart like any other event. What was sent of each file (offset and sha256
of the sent prefix) is kept in the journal under `state_dir/driver/`, written only after the whole
checkpoint was admitted: a crash half-way sends those bytes again, which the control plane's
reassembly (offset ≤ what it holds) absorbs. A final rejection of a checkpoint event forgets the state,
so the next checkpoint sends whole files.
"""

from __future__ import annotations

import os
import stat
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import msgspec

from driver import logs
from driver.checkpoints import chunks, layout
from driver.ports.files import open_directory

if TYPE_CHECKING:
    from driver.kernel.core import Kernel

log = logs.get("driver.checkpoints")

SENT_KEY = "checkpoint_sent"


class CheckpointError(Exception):
    pass


def read_file(home: Path, rel: str) -> bytes:
    """The file's bytes, its directories walked and the file opened without following a link."""
    parts = rel.split("/")
    try:
        dir_fd = open_directory(home.resolve().joinpath(*parts[:-1]))
    except OSError as exc:
        raise CheckpointError(f"{rel}: {exc.strerror or exc}") from None
    try:
        fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError as exc:
        raise CheckpointError(f"{rel}: {exc.strerror or exc}") from None
    finally:
        os.close(dir_fd)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise CheckpointError(f"{rel}: not a regular file")
        return f.read(chunks.MAX_CHECKPOINT_BYTES + 1)


def collect(home: Path, names: list[str]) -> dict[str, bytes]:
    return {rel: read_file(home, rel) for rel in names}


class Checkpointer:
    def __init__(self, kernel: Kernel) -> None:
        self.k = kernel
        boot = kernel.boot
        self.provider_dir = Path(boot.session.state_dir) / "providers" / boot.execution.runtime
        self.layout = layout.layout_for(boot.execution, self.provider_dir)
        self._secrets: list[bytes] | None = None  # on the first checkpoint: off the start's path
        self._lock = anyio.Lock()
        self.last_run_id: str | None = None
        self.recorded = 0  # checkpoints admitted by this process (for tests and figures)
        self.last_recorded_event: str | None = None

    async def after_run(self, run_id: str) -> str | None:
        self.last_run_id = run_id
        return await self.record(run_id)

    async def at_stop(self) -> str | None:
        return await self.record(self.last_run_id)

    def forget(self) -> None:
        """The control plane finally rejected a checkpoint event: send whole files next time."""
        self.k.journal.set_text(SENT_KEY, None)

    async def record(self, run_id: str | None) -> str | None:
        """Admit one checkpoint of the current native session; the `checkpoint.recorded` event id, or
        None when there is nothing to checkpoint or it could not be taken (then a diagnostic says why,
        and the session goes on). Never raises."""
        try:
            async with self._lock:
                return await self._record(run_id)
        except Exception as exc:  # a checkpoint never takes the driver down
            log.exception("checkpoint.failed", run_id=run_id)
            await self._diagnose("checkpoint.failed", f"the checkpoint was not taken: {type(exc).__name__}: {exc}")
            return None

    async def _record(self, run_id: str | None) -> str | None:
        k = self.k
        current = k.provider.current
        if self.layout is None or current is None or current.runtime != k.boot.execution.runtime:
            return None
        ref, where = current.value, self.layout
        names = await anyio.to_thread.run_sync(layout.session_files, where, ref)
        if not names:
            log.info("checkpoint.no_files", native_ref=ref)
            return None
        try:
            files = await anyio.to_thread.run_sync(collect, where.home, names)
        except CheckpointError as exc:
            await self._diagnose("checkpoint.failed", f"the checkpoint was not taken: {exc}")
            return None
        total = sum(len(d) for d in files.values())
        if total > chunks.MAX_CHECKPOINT_BYTES:
            await self._diagnose(
                "checkpoint.too_large",
                f"the native session's files are {total} bytes, over the {chunks.MAX_CHECKPOINT_BYTES}-byte limit",
                {"bytes": total, "limit": chunks.MAX_CHECKPOINT_BYTES, "native_ref": ref},
            )
            return None
        if self._secrets is None:
            from driver.adapters.process import secret_values

            self._secrets = [s.encode() for s in secret_values(k.boot.execution.environment)]
        secrets = self._secrets
        leaked = sorted(p for p, d in files.items() if any(s in d for s in secrets))
        if leaked:
            # A credential of the execution is written in the session itself (e.g. a tool printed the
            # environment): no checkpoint may carry it, so none is taken. Names only, never the value.
            await self._diagnose(
                "checkpoint.withheld",
                "a file of the native session holds a credential of execution.environment; no checkpoint taken",
                {"paths": leaked, "native_ref": ref},
            )
            return None
        started = time.monotonic()
        sent = chunks.decode_sent(await anyio.to_thread.run_sync(k.journal.text, SENT_KEY), ref)
        checkpoint_id = f"ckpt-{uuid.uuid4().hex}"
        body = chunks.manifest(checkpoint_id, run_id, k.boot.execution.runtime, ref, files)
        if len(msgspec.json.encode(body)) > k.max_event_bytes:
            # §4.3 would cut the manifest's file list, and a cut manifest restores nothing: none is sent.
            await self._diagnose(
                "checkpoint.too_large",
                f"the manifest of {len(files)} files does not fit max_event_bytes ({k.max_event_bytes})",
                {"files": len(files), "limit": k.max_event_bytes, "native_ref": ref},
            )
            return None
        new_sent: dict[str, chunks.Sent] = {}
        sent_bytes = 0
        for rel, data in sorted(files.items()):
            offset = chunks.resume_offset(data, sent.get(rel))
            if offset is not None:
                try:
                    pieces = chunks.file_chunks(checkpoint_id, rel, data, offset, k.max_event_bytes)
                except chunks.ChunkTooSmall as exc:
                    await self._diagnose("checkpoint.failed", f"the checkpoint was not taken: {exc}")
                    return None
                for payload in pieces:
                    await k.emit("checkpoint.file", payload)
                sent_bytes += len(data) - offset
            new_sent[rel] = chunks.Sent(len(data), chunks.sha256_hex(data))
        event_id = await k.emit("checkpoint.recorded", body)
        await anyio.to_thread.run_sync(k.journal.set_text, SENT_KEY, chunks.encode_sent(ref, new_sent))
        self.recorded += 1
        self.last_recorded_event = event_id
        log.info(
            "checkpoint.recorded",
            checkpoint_id=checkpoint_id,
            run_id=run_id,
            files=len(files),
            bytes=total,
            sent_bytes=sent_bytes,
            ms=round((time.monotonic() - started) * 1000, 1),
        )
        return event_id

    async def _diagnose(self, code: str, message: str, details: dict[str, object] | None = None) -> None:
        try:
            await self.k.emit(
                "diagnostic.reported",
                {"code": code, "severity": "warning", "message": message, "details": details or {}},
            )
        except Exception:
            log.exception("checkpoint.diagnostic_failed", code=code)
