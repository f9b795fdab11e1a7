"""What the proxy forwards: a list of endpoints per route, matched after the target is normalised (no I/O).

The proxy is not a relay that forwards what it does not recognise (PROTOCOL §9): a request is
forwarded only when its method and normalised path are on its route's list; anything else (a batch
endpoint, `/v1/complete`, embeddings, a path that walks out with `..` or `%2e%2e`) is refused with 404
in the upstream's error shape and never carries the key anywhere. The path forwarded is the
normalised one, so the upstream serves exactly what was matched (a `#fragment` is dropped: it never
belongs to a request target).

A model endpoint (`dialect` set) is metered: its body is inspected (`inspect`) for the model and the
worst case of its output before it is forwarded, and a Chat Completions stream is made to report its
usage (`stream_options.include_usage`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import msgspec

from driver.model_proxy.usage import Dialect

# Output a request may produce when it states no limit (Responses without max_output_tokens, Chat
# Completions without max_tokens): what the reservation assumes.
DEFAULT_MAX_OUTPUT = 32_000
MAX_CHOICES = 16  # Chat Completions `n`: each choice is another completion


@dataclass(frozen=True, slots=True)
class Endpoint:
    method: str
    path: str  # below the route's upstream base URL
    dialect: Dialect | None  # a model endpoint (metered), or None (forwarded, costs nothing)


ANTHROPIC = (
    Endpoint("POST", "/v1/messages", "anthropic"),
    Endpoint("POST", "/v1/messages/count_tokens", None),
)
# Below an OpenAI-compatible base URL (which holds the `/v1`, as SDKs and Codex take it).
OPENAI = (
    Endpoint("POST", "/responses", "responses"),
    Endpoint("POST", "/chat/completions", "chat"),
    Endpoint("GET", "/models", None),
)


def endpoints_of(family: str) -> tuple[Endpoint, ...]:
    return ANTHROPIC if family == "anthropic" else OPENAI


@dataclass(frozen=True, slots=True)
class Target:
    route: str
    path: str  # normalised, below the route
    query: str  # as sent (without '?'), '' for none


def normalise(target: str) -> Target | None:
    """The route and path a request target names, or None when it is not a plain origin-form path.

    Percent-escapes are decoded before matching (`%2e%2e` is `..`); an escaped `/` or `\\`, a
    backslash, a control character or a NUL is refused; `.` and empty segments are dropped and `..`
    removes the segment before it (never above the root)."""
    if not target.startswith("/"):
        return None  # absolute-form (`http://host/...`), authority-form, `*`
    target = target.split("#", 1)[0]
    raw_path, _, query = target.partition("?")
    lowered = raw_path.lower()
    if "%2f" in lowered or "%5c" in lowered:
        return None
    try:
        path = unquote(raw_path, errors="strict") if "%" in raw_path else raw_path
    except UnicodeDecodeError:
        return None  # `%ff`: an escape that is not UTF-8 names no listed endpoint
    if any(c in path for c in "\\%?#") or any(ord(c) < 0x20 or ord(c) == 0x7F for c in path):
        return None
    segments: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not segments:
                return None
            segments.pop()
            continue
        segments.append(part)
    if not segments:
        return None
    return Target(segments[0], "/" + "/".join(segments[1:]), query)


def match(family: str, method: str, path: str) -> Endpoint | None:
    for endpoint in endpoints_of(family):
        if endpoint.method == method and endpoint.path == path:
            return endpoint
    return None


@dataclass(frozen=True, slots=True)
class Ask:
    """What a model request asks for, read from its body before it is forwarded."""

    model: str
    max_output_tokens: int  # the worst case of its output (all choices)
    input_estimate: int  # its input, estimated from the body's size (4 bytes a token)
    body: bytes  # the body to forward (a Chat Completions stream gets include_usage)


class BadRequest(ValueError):
    """The body of a model request is not what its endpoint takes (the message says why)."""


def _field(top: dict[str, msgspec.Raw], name: str, kind: Any) -> Any:
    """One top-level field as `kind`, or None when absent or of another type. Decoded on its own,
    typed: a wrong type fails at its first byte, so a huge value of the wrong shape costs nothing."""
    raw = top.get(name)
    if raw is None:
        return None
    try:
        return msgspec.json.decode(raw, type=kind)
    except (msgspec.DecodeError, RecursionError):
        return None


def _count(top: dict[str, msgspec.Raw], name: str) -> int | None:
    value = _field(top, name, int)
    return value if isinstance(value, int) and value >= 0 else None


def inspect(dialect: Dialect, body: bytes) -> Ask:
    """The fields the proxy meters, read without building the body's objects: a request body is the
    agent's, and 30 MiB of `{}`s parsed whole would be ~700 MiB of Python objects in the driver (and
    seconds of its event loop). The top level is decoded into raw slices (validated, not
    materialised); only `model`, the output limits, `n` and `stream` are decoded, each as its type."""
    try:
        top = msgspec.json.decode(body, type=dict[str, msgspec.Raw])
    except msgspec.DecodeError:
        raise BadRequest("the body of a model request must be a JSON object") from None
    except RecursionError:  # nested ~1000 levels deep
        raise BadRequest("the body of a model request is nested too deep") from None
    model = _field(top, "model", str) or ""
    if dialect == "anthropic":
        limit = _count(top, "max_tokens")
    elif dialect == "responses":
        limit = _count(top, "max_output_tokens")
    else:
        limit = _count(top, "max_completion_tokens")
        if limit is None:
            limit = _count(top, "max_tokens")
    output = DEFAULT_MAX_OUTPUT if limit is None else limit
    if dialect == "chat":
        choices = _count(top, "n") or 1
        if choices > MAX_CHOICES:
            raise BadRequest(f"n above {MAX_CHOICES} is not forwarded by this proxy")
        output *= choices
        if _field(top, "stream", bool) is True:
            # A stream reports its usage only when asked: ask, whatever the client said.
            options = _field(top, "stream_options", dict[str, msgspec.Raw]) or {}
            options["include_usage"] = msgspec.Raw(b"true")
            top["stream_options"] = msgspec.Raw(msgspec.json.encode(options))
            body = msgspec.json.encode(top)
    return Ask(str(model), output, len(body) // 4 + 1, body)
