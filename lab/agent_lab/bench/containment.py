"""What containment (driver.containment.wrapper, PROTOCOL §8) costs at provider start-up.

Spawn-to-first-output of a small Python provider (it prints one line as soon as it runs), and
spawn-to-exit of `true`, for each mode beside the baseline (no wrapper): `pdeathsig` (setpriv) and
`pidns` (bwrap PID namespace, shell as pid 1: the default where namespaces are allowed), and
`subreaper` (driver/containment/subreaper.py: the fallback where they are not). Also the
one-time probe that picks the mode, the state_dir lock, and the clean-up of a predecessor's record.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agent_lab.bench._common import goal, median, table
from driver import containment
from driver.containment import statelock

RUNS = 25
PROVIDER = [sys.executable, "-S", "-c", "print('up', flush=True)"]


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000


def _first_line(prefix: list[str]) -> float:
    t0 = time.perf_counter()
    p = subprocess.Popen([*prefix, *PROVIDER], stdout=subprocess.PIPE, start_new_session=True)
    assert p.stdout is not None
    p.stdout.readline()
    took = _ms(t0)
    p.wait()
    return took


def _to_exit(prefix: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([*prefix, "true"], check=True, start_new_session=True)
    return _ms(t0)


def main() -> None:
    t0 = time.perf_counter()
    pidns = containment.pidns_prefix()
    probe_ms = _ms(t0)
    modes: list[tuple[str, list[str] | None]] = [
        ("none (baseline)", []),
        ("pdeathsig", containment.pdeathsig_prefix()),
        ("subreaper (fallback)", containment.subreaper_prefix()),
        ("pidns (default)", pidns),
    ]
    available = [(name, prefix) for name, prefix in modes if prefix is not None]
    firsts: dict[str, list[float]] = {name: [] for name, _ in available}
    exits: dict[str, list[float]] = {name: [] for name, _ in available}
    for _name, prefix in available:
        _first_line(prefix)  # warm the page cache for this mode
    # Interleaved, so a burst of load on a shared machine hits every mode alike.
    for _ in range(RUNS):
        for name, prefix in available:
            firsts[name].append(_first_line(prefix))
            exits[name].append(_to_exit(prefix))
    results = {name: (median(firsts[name]), median(exits[name])) for name, _ in available}
    rows: list[tuple[str, object, object]] = [
        (name, *results[name]) if name in results else (name, "unavailable", "unavailable") for name, _ in modes
    ]
    table(
        f"provider start through each containment mode (median of {RUNS}, ms)",
        ["mode", "spawn to first output", "spawn to exit of `true`"],
        rows,
    )
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        lock = statelock.acquire(Path(tmp))
        lock_ms = _ms(t0)
        lock.release()
        t0 = time.perf_counter()
        containment.track(Path(tmp))
        track_ms = _ms(t0)
    print(
        f"\none-time: mode probe {probe_ms:.1f} ms, state_dir lock {lock_ms:.2f} ms,"
        f" predecessor clean-up {track_ms:.1f} ms"
    )
    if "pidns (default)" in results:
        extra = results["pidns (default)"][0] - results["none (baseline)"][0]
        goal("pidns adds under 25 ms to a provider's start", extra < 25, f"+{extra:.1f} ms")


if __name__ == "__main__":
    main()
