"""Which requests may change something (PROTOCOL §9: the console is an operator's tool). No I/O.

A browser sends the session cookie with every request to the console's host, whatever page made the
request, and `SameSite` does not tell ports apart: a page the agent serves on another loopback port,
opened by the operator, would act with the operator's session. So a request that changes anything
(any method but GET, HEAD and OPTIONS) is refused when:

- it carries an `Origin` that is not the console's own (`http://` + the `Host` it was sent to, and that
  host one this port answers to: a loopback name or the configured host), or it is made with the
  session cookie and carries no `Origin` at all (every browser sends one on such requests);
- its body is not declared JSON (`Content-Type: application/json`), when it has a body or is made with
  the session cookie. A cross-origin page can send a JSON body only after a CORS preflight, which this
  port never grants. The one exception is the login form (`POST /login`, form-encoded): it carries the
  token itself and creates only a session, and its Origin is still checked.

A bearer-token client (the CLI, tests) sends no Origin and no cookie: only the JSON rule applies to it.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

from agent_lab.controlplane.console.config import is_loopback

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def expected_origin(headers: Mapping[str, str], port: int, bound_host: str) -> str | None:
    """`http://<Host>` when the Host header names this port on a name it answers to, else None."""
    host = headers.get("host", "")
    try:
        parts = urlsplit(f"http://{host}")
        name, host_port = parts.hostname, parts.port
    except ValueError:
        return None
    if not name or host_port != port:
        return None
    if not (is_loopback(name) or name == bound_host.strip("[]") or not is_loopback(bound_host)):
        return None  # e.g. a DNS-rebound name on a loopback-bound console
    return f"http://{host}"


def refusal(
    method: str,
    parts: list[str],
    headers: Mapping[str, str],
    *,
    port: int,
    bound_host: str,
    cookie_session: bool,
) -> str | None:
    """Why this request may not go on, or None."""
    if method in SAFE_METHODS:
        return None
    origin = headers.get("origin")
    if origin is not None and origin != expected_origin(headers, port, bound_host):
        return f"cross-origin request refused: Origin {origin[:100]!r} is not this console's"
    if cookie_session and origin is None:
        return "a request made with the console's session must carry the console's Origin"
    if parts == ["login"]:
        return None
    media = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    has_body = headers.get("content-length", "0").strip() not in ("", "0")
    if (has_body or cookie_session) and media != "application/json":
        return "a request that changes something takes a JSON body (Content-Type: application/json)"
    return None
