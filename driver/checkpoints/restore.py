"""Restoring `execution.native_checkpoint` in a new sandbox (PROTOCOL §8.1): every file fetched with
its size capped and its sha256 checked while streaming (the skills' fetcher, driver/ports/fetch.py),
placed in the runtime's native home (a Claude session under the folder the new cwd derives), all or
nothing: on any mismatch the files placed so far are removed and the reason is returned, so the
caller falls back to reset + replay and says why.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path

from driver.checkpoints import chunks, layout
from driver.ports.fetch import FetchError, fetch
from driver.protocol.boot import NativeCheckpoint


@dataclass(frozen=True)
class Restored:
    files: int
    bytes: int
    ms: float


class RestoreFailed(Exception):
    """`reason` is a code (`checkpoint.<...>`) followed by what was wrong; never a URL's secret part."""


async def restore(checkpoint: NativeCheckpoint, runtime: str, where: layout.Layout | None, cwd: str) -> Restored:
    started = time.monotonic()
    if checkpoint.runtime != runtime:
        raise RestoreFailed(f"checkpoint.runtime_mismatch: the checkpoint is of {checkpoint.runtime}, not {runtime}")
    if where is None:
        raise RestoreFailed("checkpoint.unsupported: the driver does not know this runtime's session files")
    if not checkpoint.files:
        raise RestoreFailed("checkpoint.empty: the checkpoint lists no file")
    total = sum(f.size for f in checkpoint.files)
    if total > chunks.MAX_CHECKPOINT_BYTES:
        raise RestoreFailed(f"checkpoint.too_large: {total} bytes, over {chunks.MAX_CHECKPOINT_BYTES}")
    targets: list[tuple[str, Path]] = []
    seen: set[str] = set()
    home = where.home.resolve()
    for f in checkpoint.files:
        if not layout.allowed(where.family, f.path, checkpoint.native_ref):
            raise RestoreFailed(f"checkpoint.path_refused: {f.path!r} is not a file of session {checkpoint.native_ref}")
        rel = layout.restore_path(where.family, f.path, str(Path(cwd).resolve()))
        if rel in seen:
            raise RestoreFailed(f"checkpoint.path_refused: {f.path!r} is listed twice")
        seen.add(rel)
        targets.append((rel, home.joinpath(*rel.split("/"))))
    placed: list[Path] = []
    try:
        for f, (rel, dest) in zip(checkpoint.files, targets, strict=True):
            try:
                size = await fetch(f.url, dest, sha256=f.sha256, max_bytes=f.size)
            except FetchError as exc:
                code = "checkpoint.hash_mismatch" if "sha256" in str(exc) else "checkpoint.fetch_failed"
                raise RestoreFailed(f"{code}: {rel}: {exc}") from None
            placed.append(dest)
            if size != f.size:
                raise RestoreFailed(f"checkpoint.size_mismatch: {rel}: {size} bytes, the manifest says {f.size}")
    except BaseException:
        for path in placed:
            with contextlib.suppress(OSError):
                path.unlink()
        raise
    return Restored(files=len(placed), bytes=total, ms=round((time.monotonic() - started) * 1000, 1))
