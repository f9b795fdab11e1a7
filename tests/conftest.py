"""Suite-wide scheduling for parallel runs (`make test` runs `pytest -n 4 --dist loadgroup`).

Most of the suite's time is waiting on real runtimes, so it runs in pytest-xdist workers. Under xdist:
- each test file is one group (`xdist_group`), so a file's module-scoped set-up (fake endpoints, a
  built wheel, a browser) is made once, on one worker, as with `--dist loadfile`;
- the files that drive real processes are handed out first (the longest work starts first);
- tests marked `serial` (they measure time, CPU or memory) form one group, handed out first, and run
  while no other test runs: every test holds a shared lock for its whole protocol (set-up, call,
  tear-down) and a serial test an exclusive one, with a turnstile so that waiting serial tests are
  not starved by the others. The lock is taken outside pytest-timeout's timer.
Without xdist nothing changes: no lock, no reordering.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Generator
from pathlib import Path

import pytest

SERIAL = "serial"
# Files with tests of these markers start real driver or runtime processes: seconds per test.
SLOW_MARKERS = ("provider", "faults", "image", "browser")


def _parallel() -> bool:
    return "PYTEST_XDIST_WORKER" in os.environ


def _is_serial(item: pytest.Item | None) -> bool:
    return item is not None and item.get_closest_marker(SERIAL) is not None


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups into the node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not _parallel():
        return
    weight: dict[str, int] = {}
    for item in items:
        group = SERIAL if _is_serial(item) else item.nodeid.split("::", 1)[0]
        if not any(m.name == "xdist_group" for m in item.iter_markers()):
            item.add_marker(pytest.mark.xdist_group(group))
        slow = any(item.get_closest_marker(m) for m in SLOW_MARKERS)
        weight[group] = weight.get(group, 0) + (20 if slow else 1)
    # Every worker sorts the same way (xdist checks that the collections are equal).
    rank = {g: (g != SERIAL, -w) for g, w in weight.items()}
    items.sort(key=lambda it: rank[SERIAL if _is_serial(it) else it.nodeid.split("::", 1)[0]])


class _Locks:
    """The shared/exclusive lock of one worker, on files every worker of this run opens."""

    def __init__(self, folder: Path) -> None:
        self.turnstile = os.open(folder / "serial.turnstile", os.O_RDWR | os.O_CREAT, 0o600)
        self.tests = os.open(folder / "serial.lock", os.O_RDWR | os.O_CREAT, 0o600)
        self.exclusive = False
        self.held = False

    def acquire(self, serial: bool) -> None:
        if self.held:
            return  # the exclusive lock kept across consecutive serial tests
        fcntl.flock(self.turnstile, fcntl.LOCK_EX)
        fcntl.flock(self.tests, fcntl.LOCK_EX if serial else fcntl.LOCK_SH)
        if not serial:
            fcntl.flock(self.turnstile, fcntl.LOCK_UN)
        self.exclusive, self.held = serial, True

    def release(self, keep: bool) -> None:
        if keep and self.exclusive:
            return
        fcntl.flock(self.tests, fcntl.LOCK_UN)
        if self.exclusive:
            fcntl.flock(self.turnstile, fcntl.LOCK_UN)
        self.exclusive = self.held = False


LOCKS = pytest.StashKey[_Locks]()


@pytest.hookimpl(hookwrapper=True, tryfirst=True)  # outermost: outside pytest-timeout's timer
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    if not _parallel():
        yield
        return
    if LOCKS not in item.config.stash:
        # A worker's basetemp is <run>/popen-gwN: the run's folder is shared by its workers only.
        folder = item.config._tmp_path_factory.getbasetemp().parent  # type: ignore[attr-defined]
        item.config.stash[LOCKS] = _Locks(folder)
    locks = item.config.stash[LOCKS]
    serial = _is_serial(item)
    locks.acquire(serial)
    try:
        yield
    finally:
        locks.release(keep=serial and _is_serial(nextitem))
