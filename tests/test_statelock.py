"""The state_dir lock (PROTOCOL §8): one process per state_dir, taken before the epoch moves."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from driver.containment import statelock


def test_second_acquire_names_the_holder_and_release_frees_it(tmp_path: Path) -> None:
    lock = statelock.acquire(tmp_path / "state")
    # The holder's pid leads the line (then its start time and a MAC, for --handover: driver/keeper/handover.py).
    assert (tmp_path / "state" / statelock.LOCK_NAME).read_text().split()[0] == str(os.getpid())
    # flock is per open file description: a second open in this process conflicts like another process.
    with pytest.raises(statelock.StateDirLocked) as info:
        statelock.acquire(tmp_path / "state")
    assert info.value.holder == os.getpid()
    assert f"pid {os.getpid()}" in str(info.value)
    lock.release()
    again = statelock.acquire(tmp_path / "state")
    again.release()


def test_lock_descriptor_is_not_inherited(tmp_path: Path) -> None:
    lock = statelock.acquire(tmp_path)
    try:
        assert lock._fd is not None and not os.get_inheritable(lock._fd)
    finally:
        lock.release()
