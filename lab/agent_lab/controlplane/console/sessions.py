"""Console sessions and one-time login codes (PROTOCOL §9: the console is an operator's tool).

The session cookie is a random id this console issued, never the token: a leaked cookie is not the
credential, and it dies with the process. A login link carries a one-time code, not the token: the
first visit exchanges it for a session; a second visit of the same link (a browser history, a shared
terminal log) finds nothing. Both are kept in memory, bounded (the oldest go first). No I/O.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections import OrderedDict

MAX_SESSIONS = 256
MAX_CODES = 64
CODE_TTL_S = 24 * 3600.0  # a printed link waits for the operator, but not forever


class Sessions:
    def __init__(self) -> None:
        self._ids: OrderedDict[str, None] = OrderedDict()

    def issue(self) -> str:
        sid = secrets.token_urlsafe(32)
        self._ids[sid] = None
        while len(self._ids) > MAX_SESSIONS:
            self._ids.popitem(last=False)
        return sid

    def valid(self, sid: str | None) -> bool:
        if not sid:
            return False
        # Compared in constant time against each: a handful of live sessions at most.
        return any(hmac.compare_digest(sid.encode(), known.encode()) for known in self._ids)


class LoginCodes:
    def __init__(self) -> None:
        self._codes: OrderedDict[str, float] = OrderedDict()
        self._now = time.monotonic

    def mint(self) -> str:
        code = secrets.token_urlsafe(24)
        self._codes[code] = self._now() + CODE_TTL_S
        while len(self._codes) > MAX_CODES:
            self._codes.popitem(last=False)
        return code

    def redeem(self, code: str) -> bool:
        """True once per minted code (before it expires); the code is gone afterwards either way."""
        for known in list(self._codes):
            if hmac.compare_digest(code.encode(), known.encode()):
                expires = self._codes.pop(known)
                return self._now() < expires
        return False
