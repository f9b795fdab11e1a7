"""The console token: checked in constant time, carried by a cookie (set by the login) or a bearer header."""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from http.cookies import CookieError, SimpleCookie

COOKIE = "agent_driver_console"


def presented_tokens(headers: Mapping[str, str]) -> list[str]:
    """Every token the request carries: the bearer header's and the console cookie's."""
    found: list[str] = []
    scheme, _, value = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        found.append(value.strip())
    raw = headers.get("cookie")
    if raw:
        jar: SimpleCookie = SimpleCookie()
        try:
            jar.load(raw)
        except CookieError:
            return found
        if COOKIE in jar and jar[COOKIE].value:
            found.append(jar[COOKIE].value)
    return found


def token_matches(expected: str, presented: str) -> bool:
    return hmac.compare_digest(expected.encode(), presented.encode())


def has_token(expected: str, headers: Mapping[str, str]) -> bool:
    return any(token_matches(expected, t) for t in presented_tokens(headers))


def login_cookie(token: str) -> str:
    # HttpOnly: page scripts never see it; SameSite=Strict: no other site can post with it.
    return f"{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict"
