"""Suite-wide scheduling for parallel runs (`make test` runs `pytest -n 4`, pytest-xdist).

Most of the suite's time is waiting on real runtimes, so it runs in worker processes. Under xdist:
- the unit of work is a test file (its module-scoped set-up, e.g. fake endpoints, a built wheel, a
  browser, is made once, on one worker), except in the folders whose tests each start their own
  driver process and share only in-process fake endpoints (`SPREAD`): there each test is a unit, so a
  long file does not hold the run's tail;
- tests marked `serial` (they measure time, CPU or memory) are one unit, handed out first, and run
  while no other test runs: every test holds a shared lock for its whole protocol (set-up, call,
  tear-down), a serial test an exclusive one (kept across consecutive serial tests), with a turnstile
  so that other workers' tests cannot starve it. The lock is taken outside pytest-timeout's timer;
- then the heavier units first (tests that start real processes weigh more).
The scheduler is xdist's LoadScopeScheduling with these units (`pytest_xdist_make_scheduler`): xdist's
own `--dist loadgroup` cannot be used, its group suffix is lost with pytest 9's node ids.
Without xdist nothing changes: no lock, no reordering.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

SERIAL = "serial"
SERIAL_IDS = "serial-tests.txt"  # written by the workers into the run's folder, read by the scheduler
SPREAD = ("tests/kernel/", "tests/faults/")
# Tests of these markers start real driver or runtime processes: seconds each.
SLOW_MARKERS = ("provider", "faults", "image", "browser")


def _worker() -> bool:
    return "PYTEST_XDIST_WORKER" in os.environ


def _run_folder(config: pytest.Config) -> Path:
    """The run's folder: the controller's basetemp; a worker's is <run>/popen-gwN."""
    base: Path = config._tmp_path_factory.getbasetemp()  # type: ignore[attr-defined]
    return base.parent if _worker() else base


def _is_serial(item: pytest.Item | None) -> bool:
    return item is not None and item.get_closest_marker(SERIAL) is not None


def unit_of(nodeid: str, serial: bool) -> str:
    """The unit of work a test belongs to (the same rule in the workers and in the scheduler)."""
    if serial:
        return SERIAL
    path = nodeid.split("::", 1)[0]
    return nodeid if path.startswith(SPREAD) else path


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not _worker():
        return
    weight: dict[str, int] = {}
    for item in items:
        slow = any(item.get_closest_marker(m) for m in SLOW_MARKERS)
        unit = unit_of(item.nodeid, _is_serial(item))
        weight[unit] = weight.get(unit, 0) + (20 if slow else 1)
    # Every worker sorts the same way (xdist checks that the collections are equal); the scheduler
    # hands the units out in this order. sort is stable: a file's tests stay together, in order.
    rank = {unit: (unit != SERIAL, -w) for unit, w in weight.items()}
    items.sort(key=lambda it: rank[unit_of(it.nodeid, _is_serial(it))])
    serial = "".join(f"{it.nodeid}\n" for it in items if _is_serial(it))
    folder = _run_folder(config)
    mine = folder / f"{SERIAL_IDS}.{os.environ['PYTEST_XDIST_WORKER']}"
    mine.write_text(serial)
    mine.replace(folder / SERIAL_IDS)  # before this worker reports its collection


@pytest.hookimpl(optionalhook=True)  # an xdist hook: unknown without xdist (`-p no:xdist`)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") not in ("load", "loadscope", "loadfile", "loadgroup"):
        return None  # `--dist each` and others: xdist's own
    from xdist.scheduler import LoadScopeScheduling

    class Units(LoadScopeScheduling):  # type: ignore[misc]
        """LoadScopeScheduling over `unit_of`, in the collection's order."""

        serial: set[str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.serial is None:  # first called once every worker has collected
                self.serial = set((_run_folder(config) / SERIAL_IDS).read_text().splitlines())
            return unit_of(nodeid, nodeid in self.serial)

    config.option.loadscopereorder = False  # the workers' order: serial first, then by weight
    return Units(config, log)


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
    if not _worker():
        yield
        return
    if LOCKS not in item.config.stash:
        item.config.stash[LOCKS] = _Locks(_run_folder(item.config))
    locks = item.config.stash[LOCKS]
    serial = _is_serial(item)
    locks.acquire(serial)
    try:
        yield
    finally:
        locks.release(keep=serial and _is_serial(nextitem))


@pytest.fixture(autouse=True)
def _containment_state() -> Generator[None, None, None]:
    """The containment choice is made once per driver process (driver/containment/wrapper.py keeps it in
    module state); a test that forces a mode or reports a degraded one must not leave it to the next test
    of its worker (test_keeper's reattach plan saw a visible state after test_containment's)."""
    from driver.containment import wrapper

    saved = (wrapper._prefix, wrapper._private, list(wrapper._degraded), wrapper._state_visible)
    yield
    wrapper._prefix, wrapper._private, wrapper._state_visible = saved[0], saved[1], saved[3]
    wrapper._degraded[:] = saved[2]
