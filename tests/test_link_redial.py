"""The link's redial loop (driver/net/link.py `Link.run`) under tenacity, without sockets: the first dial is
tenacity's first attempt, each delay is the link core's (full jitter on the injected RNG), a fatal close
code ends the loop with its reaction, and an exception in a dial is contained and redialed."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from driver.net.link import Link, LinkHooks
from driver.protocol.backoff import full_jitter
from driver.protocol.boot import ControlConfig
from driver.protocol.link import CLOSE_CODES, TRANSIENT, CloseReaction, LinkCore
from driver.queue.journal import Journal
from driver.queue.outbox import Outbox

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class TopOfRange(random.Random):
    def uniform(self, a: float, b: float) -> float:
        return b


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    j = Journal(tmp_path / "j.sqlite3", synchronous="OFF")
    yield j
    j.close()


def scripted_link(journal: Journal, outcomes: list[CloseReaction | BaseException]) -> tuple[Link, list[float]]:
    async def nothing(*_: object) -> None:
        return None

    hooks = LinkHooks(lambda: b"{}", lambda: b"{}", nothing, nothing, nothing)
    # Ceilings 1 ms, 2 ms, 4 ms...: the test sleeps for real, briefly.
    core = LinkCore(backoff_factory=lambda: full_jitter(first=0.001, cap=0.004, rng=TopOfRange()))
    control = ControlConfig(url="ws://127.0.0.1:1/", token="t")
    link = Link(control, "drv-unit", Outbox(journal, "d", "s", 1), hooks, core)
    slept: list[float] = []

    async def connect_once() -> CloseReaction:
        outcome = outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    real_next = core.next_delay

    def next_delay() -> float:
        slept.append(real_next())
        return slept[-1]

    link._connect_once = connect_once  # type: ignore[method-assign]
    core.next_delay = next_delay  # type: ignore[method-assign]
    return link, slept


async def test_redials_with_the_cores_delays_until_a_fatal_code(journal: Journal) -> None:
    fatal = CLOSE_CODES[4401]
    link, slept = scripted_link(journal, [TRANSIENT, TRANSIENT, TRANSIENT, fatal])
    with anyio.fail_after(10):
        reaction = await link.run()
    assert reaction == fatal and reaction.exit_status == 77
    assert slept == [0.001, 0.002, 0.004] and link.reconnects == 3


async def test_a_fatal_first_dial_returns_at_once(journal: Journal) -> None:
    link, slept = scripted_link(journal, [CLOSE_CODES[4410]])
    assert (await link.run()).exit_status == 0
    assert slept == [] and link.reconnects == 0


async def test_an_exception_in_a_dial_is_contained_and_redialed(journal: Journal) -> None:
    fatal = CLOSE_CODES[4401]
    link, slept = scripted_link(journal, [TRANSIENT, RuntimeError("a bug in the dial"), fatal])
    with anyio.fail_after(10):
        assert await link.run() == fatal
    assert slept == [0.001, 0.002] and link.reconnects == 2
