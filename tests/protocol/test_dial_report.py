"""driver.protocol.dial_report on a fake clock: one warning starts a streak of failed dials, one more a
minute while it lasts (with the attempt count); a link that opens ends the streak and later failures
say "lost"; the URL in the line carries no user info or query."""

from __future__ import annotations

from driver.protocol.dial_report import DialReporter, public_url

URL = "ws://127.0.0.1:9/driver"


def test_first_failure_warns_then_one_a_minute() -> None:
    r = DialReporter(URL, repeat_s=60)
    first = r.failed(100.0, "ConnectionRefusedError: refused", 0.5)
    assert first is not None and first.state == "never connected" and first.attempts == 1
    assert URL in first.message and "never connected" in first.message and "redialing in 0.5 s" in first.message
    assert [r.failed(100.0 + t, "e", 1.0) for t in (1, 5, 30, 59)] == [None] * 4
    again = r.failed(161.0, "e", 30.0)
    assert again is not None and again.attempts == 6 and again.failing_for_s == 61.0
    assert "6 attempts in 61 s" in again.message


def test_an_open_link_ends_the_streak_and_later_failures_are_lost() -> None:
    r = DialReporter(URL)
    assert r.failed(0.0, "e", 1.0) is not None
    r.opened()
    lost = r.failed(5.0, "e", 1.0)
    assert lost is not None and lost.state == "lost" and lost.attempts == 1
    assert "lost the control plane at ws://127.0.0.1:9/driver" in lost.message


def test_the_url_in_the_line_has_no_credentials_or_query() -> None:
    assert public_url("wss://user:pw@cp.example:8443/driver?x=1#f") == "wss://cp.example:8443/driver"
    assert public_url("ws://[::1]:9/d") == "ws://[::1]:9/d"
