"""Reconnect delays: capped exponential backoff with full jitter (PROTOCOL §2.4).

A generator of delays, as `websockets` does it, so tests drive it with a seeded RNG and no clock.
"""

from __future__ import annotations

import random
from collections.abc import Iterator


def full_jitter(
    *, first: float = 1.0, factor: float = 2.0, cap: float = 30.0, rng: random.Random | None = None
) -> Iterator[float]:
    """Delays uniform in [0, min(cap, first * factor**n)] for n = 0, 1, 2, ... (the first in 0-1 s)."""
    r = rng or random.Random()
    ceiling = first
    while True:
        yield r.uniform(0.0, min(cap, ceiling))
        ceiling = min(cap, ceiling * factor)
