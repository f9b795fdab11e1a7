"""Who a console request is: the console token as a bearer header (checked in constant time), or the
session cookie a login issued (a random id, never the token: `sessions.py`). The cookie is named after
the console's port, so two consoles on one machine never overwrite each other's session; it is
HttpOnly (no page script reads it) and SameSite=Strict (no other site sends it). Ports are not sites,
so what keeps a page on another loopback port out is the Origin rule (`guard.py`)."""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from http.cookies import CookieError, SimpleCookie

COOKIE_PREFIX = "agent_driver_console"


def cookie_name(port: int) -> str:
    return f"{COOKIE_PREFIX}_{port}"


def bearer(headers: Mapping[str, str]) -> str | None:
    scheme, _, value = headers.get("authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def cookie(headers: Mapping[str, str], name: str) -> str | None:
    raw = headers.get("cookie")
    if not raw:
        return None
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(raw)
    except CookieError:
        return None
    return jar[name].value if name in jar and jar[name].value else None


def token_matches(expected: str, presented: str) -> bool:
    return hmac.compare_digest(expected.encode(), presented.encode())


def has_bearer_token(expected: str, headers: Mapping[str, str]) -> bool:
    presented = bearer(headers)
    return presented is not None and token_matches(expected, presented)


def session_cookie(name: str, session_id: str) -> str:
    return f"{name}={session_id}; Path=/; HttpOnly; SameSite=Strict"
