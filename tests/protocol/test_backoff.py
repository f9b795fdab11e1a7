"""Reconnect delays (PROTOCOL §2.4): capped exponential backoff with full jitter, on a seeded RNG."""

from __future__ import annotations

import itertools
import random

from driver.protocol.backoff import full_jitter


class TopOfRange(random.Random):
    """Always picks the top of the range, so the ceilings themselves are visible."""

    def uniform(self, a: float, b: float) -> float:
        return b


class BottomOfRange(random.Random):
    def uniform(self, a: float, b: float) -> float:
        return a


def test_ceilings_double_from_one_second_and_cap_at_thirty() -> None:
    delays = list(itertools.islice(full_jitter(rng=TopOfRange()), 9))
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0, 30.0]


def test_full_jitter_reaches_down_to_zero() -> None:
    assert list(itertools.islice(full_jitter(rng=BottomOfRange()), 3)) == [0.0, 0.0, 0.0]


def test_seeded_delays_are_uniform_under_the_ceiling() -> None:
    ours = list(itertools.islice(full_jitter(rng=random.Random(1234)), 12))
    reference = random.Random(1234)
    expected = [reference.uniform(0.0, min(30.0, 2.0**n)) for n in range(12)]
    assert ours == expected
    assert 0.0 <= ours[0] <= 1.0
    assert all(0.0 <= d <= 30.0 for d in ours)


def test_first_delay_is_within_one_second_for_many_seeds() -> None:
    firsts = [next(full_jitter(rng=random.Random(seed))) for seed in range(200)]
    assert all(0.0 <= d <= 1.0 for d in firsts)
    assert max(firsts) > 0.9 and min(firsts) < 0.1, "not spread over the whole 0-1 s range"


def test_long_run_never_exceeds_the_cap() -> None:
    delays = list(itertools.islice(full_jitter(rng=random.Random(9)), 200))
    assert max(delays) <= 30.0
    assert max(delays[10:]) > 15.0, "late delays should use the capped range, not stay small"


def test_every_policy_is_a_tenacity_strategy_driven_without_a_clock() -> None:
    from tenacity.wait import wait_exponential

    from driver.kernel.supervision import CrashWindow
    from driver.protocol.backoff import delays, exponential, jittered
    from driver.queue.outbox_types import RetryPolicy

    assert isinstance(jittered(), wait_exponential) and isinstance(exponential(base=1, cap=2), wait_exponential)
    assert list(itertools.islice(delays(exponential(base=0.25, cap=1.0)), 4)) == [0.25, 0.5, 1.0, 1.0]
    # The outbox's resend and the provider's restart keep their schedules under tenacity.
    assert [RetryPolicy(base=0.25, cap=30.0).delay(n) for n in (0, 1, 2, 3)] == [0.25, 0.25, 0.5, 1.0]
    window = CrashWindow(backoff_base_s=1.0, backoff_cap_s=4.0, clock=lambda: 0.0)
    assert [window.delay_for(n) for n in (1, 2, 3, 4, 5)] == [0.0, 1.0, 2.0, 4.0, 4.0]
