"""Refusals in the upstream's own error shape (no I/O): what an SDK in the provider parses and shows.

Anthropic: `{"type": "error", "error": {"type": ..., "message": ...}}`; OpenAI:
`{"error": {"message": ..., "type": ..., "param": null, "code": ...}}`. A budget refusal names
`budget.exceeded` in the error's `type` and `code` (the two SDKs surface those fields), and is sent
with `x-should-retry: false`, which the vendors' SDKs honour, so the agent does not retry it.
"""

from __future__ import annotations

import json

from driver.model_proxy.usage import Dialect

# (status, anthropic error type, openai error type, openai code)
Kind = tuple[int, str, str, str]
AUTH = (401, "authentication_error", "invalid_request_error", "invalid_api_key")
BUDGET = (429, "budget.exceeded", "budget.exceeded", "budget.exceeded")
UPSTREAM = (502, "api_error", "server_error", "upstream_unreachable")
NOT_FOUND = (404, "not_found_error", "invalid_request_error", "not_found")
TOO_LARGE = (413, "request_too_large", "invalid_request_error", "request_too_large")
BAD_REQUEST = (400, "invalid_request_error", "invalid_request_error", "bad_request")
# Retryable: too many requests in flight, or the budget is held by requests in flight.
BUSY = (429, "rate_limit_error", "rate_limit_error", "rate_limit_exceeded")
TIMEOUT = (408, "invalid_request_error", "invalid_request_error", "request_timeout")
OVERLOADED = (503, "overloaded_error", "server_error", "overloaded")
# The loopback core's own refusals (malformed, slow, too large, too many bytes held), by status.
KIND_NAMES: dict[int, tuple[str, str, str]] = {k[0]: k[1:] for k in (BAD_REQUEST, TIMEOUT, TOO_LARGE, OVERLOADED)}


def body(kind: Kind, dialect: Dialect | None, message: str) -> tuple[int, bytes]:
    status, anthropic_type, openai_type, openai_code = kind
    if dialect == "anthropic":
        payload: dict[str, object] = {"type": "error", "error": {"type": anthropic_type, "message": message}}
    else:
        payload = {"error": {"message": message, "type": openai_type, "param": None, "code": openai_code}}
    return status, json.dumps(payload).encode()
