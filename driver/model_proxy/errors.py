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


def body(kind: Kind, dialect: Dialect | None, message: str) -> tuple[int, bytes]:
    status, anthropic_type, openai_type, openai_code = kind
    if dialect == "anthropic":
        payload: dict[str, object] = {"type": "error", "error": {"type": anthropic_type, "message": message}}
    else:
        payload = {"error": {"message": message, "type": openai_type, "param": None, "code": openai_code}}
    return status, json.dumps(payload).encode()
