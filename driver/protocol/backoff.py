"""Every retry policy of the driver, as tenacity wait strategies (PROTOCOL §2.4, §4.4).

- the reconnect: capped exponential backoff with full jitter (tenacity's `wait_random_exponential`,
  here with an injectable RNG), reset by the link core after a link that stayed up 60 s;
- a provider's restart after a crash or a failed start: capped exponential, no jitter (one process
  per sandbox has nobody to collide with), the first restart at once (driver/kernel/supervision.py);
- an unreceipted lossless event's resend: capped exponential (driver/queue/outbox_types.py).

The strategies are tenacity's; what is ours is how they are driven without I/O: `delays()` asks a
strategy for attempt 1, 2, 3... with no clock and no sleep, so the sans-I/O cores (the link core, the
crash window, the outbox) keep owning *when* and tests run them on a seeded RNG. tenacity is imported
at the first delay, not at import: nothing of it is on the way to `hello`.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tenacity.wait import wait_base


class _Attempt:
    """What a tenacity wait strategy reads of a RetryCallState: the number of the attempt that failed
    (a real RetryCallState reads the clock when it is made)."""

    __slots__ = ("attempt_number",)

    def __init__(self, attempt_number: int) -> None:
        self.attempt_number = attempt_number


def delay(wait: wait_base, attempt: int) -> float:
    """The strategy's delay after failed attempt number `attempt` (1 for the first)."""
    state: Any = _Attempt(max(1, attempt))
    return float(wait(state))


def delays(wait: wait_base) -> Iterator[float]:
    n = 1
    while True:
        yield delay(wait, n)
        n += 1


def jittered(
    *, first: float = 1.0, factor: float = 2.0, cap: float = 30.0, rng: random.Random | None = None
) -> wait_base:
    """tenacity's full-jitter strategy: uniform in [0, min(cap, first * factor**(n-1))], on `rng`."""
    from tenacity.wait import wait_exponential

    class FullJitter(wait_exponential):
        # wait_random_exponential draws from the `random` module; the same draw on our own RNG.
        def __call__(self, retry_state: Any) -> float:
            return (rng or _RNG).uniform(0.0, super().__call__(retry_state))

    return FullJitter(multiplier=first, max=cap, exp_base=factor)


def exponential(*, base: float, cap: float) -> wait_base:
    """tenacity's capped exponential: base * 2**(n-1), at most `cap`."""
    from tenacity.wait import wait_exponential

    return wait_exponential(multiplier=base, max=cap)


_RNG = random.Random()


def full_jitter(
    *, first: float = 1.0, factor: float = 2.0, cap: float = 30.0, rng: random.Random | None = None
) -> Iterator[float]:
    """The reconnect delays: the first in 0-1 s, the ceiling doubling to 30 s (PROTOCOL §2.4)."""
    # A generator: its body (and tenacity's import) runs at the first reconnect, not before `hello`.
    yield from delays(jittered(first=first, factor=factor, cap=cap, rng=rng or random.Random()))
