"""Console sessions and one-time login codes (PROTOCOL §9: the console is an operator's tool).

The session cookie is never the token: it is `<issued>.<random>.<mac>`, a random id with its issue
time, authenticated by HMAC-SHA256 under a key derived from the console token and bound to the
console's port. So a leaked cookie is not the credential, is worth nothing on another port, expires
(7 days), and dies with the token; a control plane restarted with the same token (its
`--console-token-file`, same port) still knows its sessions, so an open page reconnects. A cookie
the console did not issue fails the MAC.

A login link carries a one-time code, not the token: the first visit exchanges it for a session; a
second visit of the same link (a browser history, a shared terminal log) finds nothing. Codes are
kept in memory, bounded (the oldest go first). No I/O.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict

SESSION_TTL_S = 7 * 24 * 3600
MAX_CODES = 64
CODE_TTL_S = 24 * 3600.0  # a printed link waits for the operator, but not forever


class Sessions:
    def __init__(self, token: str) -> None:
        # A key of its own (not the token itself), so a MAC never doubles as a token check.
        self._key = hmac.new(token.encode(), b"agent-driver console session v1", hashlib.sha256).digest()

    def _mac(self, port: int, issued: str, nonce: str) -> str:
        return hmac.new(self._key, f"{port}.{issued}.{nonce}".encode(), hashlib.sha256).hexdigest()

    def issue(self, port: int) -> str:
        issued, nonce = str(int(time.time())), secrets.token_urlsafe(32)
        return f"{issued}.{nonce}.{self._mac(port, issued, nonce)}"

    def valid(self, sid: str | None, port: int) -> bool:
        if not sid or sid.count(".") != 2:
            return False
        issued, nonce, mac = sid.split(".")
        if not issued.isdigit() or not hmac.compare_digest(mac, self._mac(port, issued, nonce)):
            return False
        return 0 <= time.time() - int(issued) < SESSION_TTL_S


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
