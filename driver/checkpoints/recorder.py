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
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import msgspec

from driver import logs
from driver.checkpoints import chunks, layout, source
from driver.checkpoints.source import CheckpointError

if TYPE_CHECKING:
    from driver.kernel.core import Kernel

log = logs.get("driver.checkpoints")

SENT_KEY = "checkpoint_sent"


def read_file(home: Path, rel: str) -> bytes:
    """The bytes of one session file (tests and tools; the recorder itself reads in pieces,
    `driver.checkpoints.source`), within the checkpoint budget."""
    fd = source.open_file(home, rel)
    try:
        size = os.fstat(fd).st_size
        if size > chunks.MAX_CHECKPOINT_BYTES:
            raise CheckpointError(f"{rel}: {size} bytes, over the {chunks.MAX_CHECKPOINT_BYTES}-byte limit")
        return b"".join(source.read_pieces(fd, rel, 0, size, source.READ_BYTES))
    finally:
        os.close(fd)


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
        try:
            names = await anyio.to_thread.run_sync(layout.session_files, where, ref)
        except layout.TooMany as exc:
            await self._diagnose("checkpoint.too_large", f"the checkpoint was not taken: {exc}", exc.details(ref))
            return None
        if not names:
            log.info("checkpoint.no_files", native_ref=ref)
            return None
        if self._secrets is None:
            from driver.adapters.common.process import secret_values

            self._secrets = [s.encode() for s in secret_values(k.boot.execution.environment)]
        secrets = self._secrets
        sent = chunks.decode_sent(await anyio.to_thread.run_sync(k.journal.text, SENT_KEY), ref)
        try:
            # Sizes first (nothing read), then one bounded pass per file (PROTOCOL §9: a sparse giant).
            found = await anyio.to_thread.run_sync(source.survey, where.home, names)
            facts = [
                await anyio.to_thread.run_sync(source.digest, where.home, f, sent.get(f.rel), secrets) for f in found
            ]
        except source.TooLarge as exc:
            await self._diagnose(
                "checkpoint.too_large",
                str(exc),
                {"bytes": exc.total, "limit": exc.limit, "native_ref": ref},
            )
            return None
        except CheckpointError as exc:
            await self._diagnose("checkpoint.failed", f"the checkpoint was not taken: {exc}")
            return None
        total = sum(f.size for f in facts)
        leaked = sorted(f.rel for f in facts if f.leaked)
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
        checkpoint_id = f"ckpt-{uuid.uuid4().hex}"
        entries = [(f.rel, f.size, f.sha256) for f in facts]
        body = chunks.manifest_of(checkpoint_id, run_id, k.boot.execution.runtime, ref, entries)
        if len(msgspec.json.encode(body)) > k.max_event_bytes:
            # §4.3 would cut the manifest's file list, and a cut manifest restores nothing: none is sent.
            await self._diagnose(
                "checkpoint.too_large",
                f"the manifest of {len(facts)} files does not fit max_event_bytes ({k.max_event_bytes})",
                {"files": len(facts), "limit": k.max_event_bytes, "native_ref": ref},
            )
            return None
        try:
            steps = {f.rel: chunks.chunk_step(checkpoint_id, f.rel, f.size, f.sha256, k.max_event_bytes) for f in facts}
        except chunks.ChunkTooSmall as exc:
            await self._diagnose("checkpoint.failed", f"the checkpoint was not taken: {exc}")
            return None
        sent_bytes = 0
        for f in sorted(facts, key=lambda f: f.rel):
            if f.offset is None:
                continue
            try:
                sent_bytes += await self._send_file(checkpoint_id, where.home, f, steps[f.rel], secrets)
            except CheckpointError as exc:
                await self._diagnose("checkpoint.failed", f"the checkpoint was not taken: {exc}")
                return None
        new_sent = {f.rel: chunks.Sent(f.size, f.sha256) for f in facts}
        event_id = await k.emit("checkpoint.recorded", body)
        await anyio.to_thread.run_sync(k.journal.set_text, SENT_KEY, chunks.encode_sent(ref, new_sent))
        self.recorded += 1
        self.last_recorded_event = event_id
        log.info(
            "checkpoint.recorded",
            checkpoint_id=checkpoint_id,
            run_id=run_id,
            files=len(facts),
            bytes=total,
            sent_bytes=sent_bytes,
            ms=round((time.monotonic() - started) * 1000, 1),
        )
        return event_id

    async def _send_file(self, checkpoint_id: str, home: Path, f: source.Facts, step: int, secrets: list[bytes]) -> int:
        """Emit one file's chunks from its offset, read `step` bytes at a time (at most one chunk of it in
        memory); a file never sent goes out as at least one (maybe empty) chunk. Returns the bytes sent."""
        pieces = await anyio.to_thread.run_sync(source.Pieces, home, f, step, secrets)
        at = f.offset or 0
        try:
            while True:
                piece = await anyio.to_thread.run_sync(pieces.next)
                if piece is None and at > (f.offset or 0):
                    break
                data = piece or b""
                payload = chunks.chunk_payload(checkpoint_id, f.rel, at, data, f.size, f.sha256)
                await self.k.emit("checkpoint.file", payload)
                at += len(data)
                if piece is None:
                    break
            pieces.check()
        finally:
            pieces.close()
        return at - (f.offset or 0)

    async def _diagnose(self, code: str, message: str, details: dict[str, object] | None = None) -> None:
        try:
            await self.k.emit(
                "diagnostic.reported",
                {"code": code, "severity": "warning", "message": message, "details": details or {}},
            )
        except Exception:
            log.exception("checkpoint.diagnostic_failed", code=code)
