"""The hashes of `file.changed` are bounded (PROTOCOL §9, THREATS.md item 3: reads trust sizes).

Every runtime's file reports hash a path its runtime (the agent) names. A sparse 1 TiB file in `cwd`
costs the agent no disk; hashing it whole held a worker thread (and with it the run waiting on the
report, and its cancel) for many minutes. Past `MAX_HASH_BYTES` (from fstat) no byte is read: the
report carries sha256 null. A real-driver reproduction needs the agent to win a race (grow the file
between its tool's write and the driver's hash), so the bound is shown here on the functions."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from driver.adapters.common import changed_files


def within(seconds: float, fn: Callable[[], str | None]) -> str | None:
    """`fn()`'s result, or a test failure when it has not returned within `seconds` (it runs on in a
    daemon thread: the old code would read the whole giant)."""
    out: list[str | None] = []
    worker = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        pytest.fail(f"still hashing after {seconds} s")
    return out[0]


def test_a_sparse_giant_is_not_read(tmp_path: Path) -> None:
    """Every runtime hashes through `changed_files.sha256_of` (Codex did through its own until issue 30)."""
    hash_of = changed_files.sha256_of
    giant = tmp_path.resolve() / "giant.bin"
    with giant.open("wb") as f:
        f.truncate(1 << 40)  # 1 TiB, no disk
    assert within(5, lambda: hash_of(giant)) is None
    small = tmp_path.resolve() / "small.txt"
    small.write_bytes(b"hello")
    assert within(5, lambda: hash_of(small)) == hashlib.sha256(b"hello").hexdigest()
