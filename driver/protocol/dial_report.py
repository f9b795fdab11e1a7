"""What the operator is told when the control plane cannot be reached (no I/O, time passed in).

A driver whose control URL is wrong, or whose control plane is down, redials forever (PROTOCOL §2.4):
that is right for the daemon, but the person watching its stderr must learn, in one line, which URL
it dials, whether it ever got through ("never connected") or had a link that went away ("lost"), why
the last dial failed, and what to check. One warning starts a streak of failures; then one more per
`repeat_s` while the streak lasts (with the attempt count), so a dead URL is not a wall of lines; the
dials in between are debug. A link that opens ends the streak.
"""

from __future__ import annotations

from urllib.parse import urlsplit

REPEAT_S = 60.0


def public_url(url: str) -> str:
    """`url` without user info, query or fragment: what may appear in a log line. The boot checks
    already refuse credentials in control.url (the token goes in a header); this is the second line."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:
        port = ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


class DialReport:
    """One dial failure worth a warning: the fields of its log line."""

    __slots__ = ("attempts", "error", "failing_for_s", "retry_in_s", "state", "url")

    def __init__(
        self, url: str, state: str, error: str, attempts: int, failing_for_s: float, retry_in_s: float
    ) -> None:
        self.url = url
        self.state = state
        self.error = error
        self.attempts = attempts
        self.failing_for_s = failing_for_s
        self.retry_in_s = retry_in_s

    @property
    def message(self) -> str:
        """The sentence for a person: the problem, then the next step."""
        if self.state == "never connected":
            what = f"cannot reach the control plane at {self.url}: never connected"
        else:
            what = f"lost the control plane at {self.url}: cannot reconnect"
        tries = f" ({self.attempts} attempts in {self.failing_for_s:.0f} s)" if self.attempts > 1 else ""
        return (
            f"{what}{tries}; last error: {self.error}. Check that a control plane is listening there "
            f"(control.url in the boot payload); redialing in {self.retry_in_s:.1f} s, "
            "events stay journaled until it answers"
        )

    def fields(self) -> dict[str, object]:
        return {
            "message": self.message,
            "url": self.url,
            "state": self.state,
            "error": self.error,
            "attempts": self.attempts,
            "failing_for_s": round(self.failing_for_s, 1),
            "retry_in_s": round(self.retry_in_s, 3),
        }


class DialReporter:
    """Counts a streak of failed dials and says which of them deserve a warning."""

    def __init__(self, url: str, repeat_s: float = REPEAT_S) -> None:
        self.url = public_url(url)
        self.repeat_s = repeat_s
        self.ever_open = False  # a welcome was received once in this process
        self.attempts = 0  # failed dials in the current streak
        self._streak_started = 0.0
        self._last_warned: float | None = None

    @property
    def state(self) -> str:
        return "lost" if self.ever_open else "never connected"

    def opened(self) -> None:
        """A link is open (welcome received): the streak is over."""
        self.ever_open = True
        self.attempts = 0
        self._last_warned = None

    def failed(self, now: float, error: str, retry_in_s: float) -> DialReport | None:
        """One more failed dial; its report when it deserves a warning, None when it is debug."""
        if self.attempts == 0:
            self._streak_started = now
        self.attempts += 1
        if self._last_warned is not None and now - self._last_warned < self.repeat_s:
            return None
        self._last_warned = now
        return DialReport(self.url, self.state, error, self.attempts, now - self._streak_started, retry_in_s)
