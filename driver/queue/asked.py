"""What the provider asked of the control plane and is still open, journaled with the events that
announce and settle it (PROTOCOL §6.2, §6.3, §8.2). No I/O: the journal applies what these functions
return in the transaction that makes the events durable, so a successor knows exactly what the CP saw,
never something that did not become durable.

- A permission request lives in the journal's `texts` table (its MAC covers it) under
  `permission/<run_id>/<request_id>`, decided or not, until the run's terminal: a driver that reattaches
  keeps its `request_id`.
- A host tool call lives under `host_call/<call_id>` from its `host_tool.called` to its
  `host_tool.resolved`: one a dead predecessor left open (its HTTP request died with that process's MCP
  server) is resolved by the next process, so every call ends with exactly one `host_tool.resolved`.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

PREFIX = "permission/"
KINDS = frozenset({"permission.requested", "permission.resolved"})
HOST_CALL_PREFIX = "host_call/"
HOST_CALL_KINDS = frozenset({"host_tool.called", "host_tool.resolved"})


@dataclass(frozen=True)
class Asked:
    """One permission request as the control plane saw it: open, or decided (`outcome` set)."""

    request_id: str
    tool_call_id: str
    expires_at: str
    epoch: int
    outcome: str | None = None
    option_id: str | None = None
    decided_by: str | None = None
    options: tuple[tuple[str, str], ...] = ()  # (option_id, kind), as the CP was offered them


class _Record(msgspec.Struct, omit_defaults=True):
    tool_call_id: str
    expires_at: str
    epoch: int
    options: list[tuple[str, str]] = []
    outcome: str | None = None
    option_id: str | None = None
    decided_by: str | None = None


def run_prefix(run_id: str) -> str:
    return f"{PREFIX}{run_id}/"


def key_of(run_id: str, request_id: str) -> str:
    return f"{run_prefix(run_id)}{request_id}"


def _event(body: bytes) -> tuple[int, dict[str, object]] | None:
    try:
        event = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return None
    if not isinstance(event, dict):
        return None
    payload, epoch = event.get("payload"), event.get("epoch")
    if not isinstance(payload, dict) or not isinstance(epoch, int):
        return None
    return epoch, payload


def requested(body: bytes) -> tuple[str, str] | None:
    """(request_id, the record's JSON) for a journaled `permission.requested` body; None when malformed."""
    parsed = _event(body)
    if parsed is None:
        return None
    epoch, payload = parsed
    request_id, tool_call_id = payload.get("request_id"), payload.get("tool_call_id")
    expires = payload.get("expires_at")
    if not (isinstance(request_id, str) and isinstance(tool_call_id, str) and isinstance(expires, str)):
        return None
    offered = payload.get("options")
    options = [
        (o["option_id"], o["kind"])
        for o in (offered if isinstance(offered, list) else [])
        if isinstance(o, dict) and isinstance(o.get("option_id"), str) and isinstance(o.get("kind"), str)
    ]
    record = _Record(tool_call_id=tool_call_id, expires_at=expires, epoch=epoch, options=options)
    return request_id, msgspec.json.encode(record).decode()


def request_id_of(body: bytes) -> str | None:
    parsed = _event(body)
    request_id = parsed[1].get("request_id") if parsed is not None else None
    return request_id if isinstance(request_id, str) else None


def resolved(body: bytes, before: str | None) -> tuple[str, str] | None:
    """(request_id, the updated record's JSON) for a `permission.resolved` body whose request has the
    record `before`; None when there is nothing to update (no record: the request was not this run's)."""
    parsed = _event(body)
    if parsed is None or before is None:
        return None
    payload = parsed[1]
    request_id = payload.get("request_id")
    if not isinstance(request_id, str):
        return None
    try:
        record = msgspec.json.decode(before, type=_Record)
    except msgspec.DecodeError:
        return None
    outcome, option_id, decided_by = payload.get("outcome"), payload.get("option_id"), payload.get("decided_by")
    updated = msgspec.structs.replace(
        record,
        outcome=outcome if isinstance(outcome, str) else "cancelled",
        option_id=option_id if isinstance(option_id, str) else None,
        decided_by=decided_by if isinstance(decided_by, str) else None,
    )
    return request_id, msgspec.json.encode(updated).decode()


def parse(key: str, value: str) -> Asked | None:
    """The record under `key` (from the table); None when it is not one of ours or does not decode."""
    if not key.startswith(PREFIX):
        return None
    request_id = key.rsplit("/", 1)[-1]
    try:
        r = msgspec.json.decode(value, type=_Record)
    except msgspec.DecodeError:
        return None
    options = tuple((str(o[0]), str(o[1])) for o in r.options)
    return Asked(request_id, r.tool_call_id, r.expires_at, r.epoch, r.outcome, r.option_id, r.decided_by, options)


def host_call(body: bytes) -> tuple[str, str | None] | None:
    """(its key, the record to keep, or None to remove it) for a `host_tool.called` or
    `host_tool.resolved` body; None when malformed."""
    parsed = _event(body)
    if parsed is None:
        return None
    payload = parsed[1]
    call_id = payload.get("call_id")
    if not isinstance(call_id, str):
        return None
    if "outcome" in payload:  # host_tool.resolved
        return HOST_CALL_PREFIX + call_id, None
    run_id = payload.get("run_id")
    return HOST_CALL_PREFIX + call_id, msgspec.json.encode(
        {"run_id": run_id if isinstance(run_id, str) else None}
    ).decode()
