"""Cutting an oversize event payload to fit (PROTOCOL §4.3). Pure and deterministic, no I/O.

The longest strings anywhere in the payload (nested objects and arrays included) are shortened
first, by water-filling: one level C is chosen so that every string longer than C is cut to C
(marker included) and the bytes saved cover the excess, so the longest lose the most and shorter
ones are untouched. If cutting every string to its marker is not enough, the longest arrays lose
their tail, one element at a time, longest array first; if even that is not enough (a skeleton of many
short fields), whole entries of nested objects go, largest first (never a top-level field). The result carries
`"truncated": {"original_bytes": N}`. Identity fields (`*_id`, `kind`, `status`, `code`) and
everything inside them are never cut.

Cost: linear in the payload plus a sort of the string lengths; each string is encoded once, each
cut string's prefix once more, and the whole payload is encoded once at the start and once to check
the result (a 50 MiB payload is cut in well under a second: see tests/protocol/test_oversize.py).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import Any

import msgspec

MARKER = "…[truncated]"
IDENTITY_KEYS = frozenset({"kind", "status", "code"})
TRUNCATED_KEY = "truncated"

_encode = msgspec.json.encode
_MARKER_BYTES = len(_encode(MARKER)) - 2


class Oversize(ValueError):
    """Nothing cuttable is left and the payload still does not fit (e.g. huge identity fields)."""


def is_identity(key: str) -> bool:
    return key in IDENTITY_KEYS or key.endswith("_id")


def encoded_size(payload: Any) -> int:
    return len(_encode(payload))


def cut(payload: dict[str, Any], limit: int) -> dict[str, Any]:
    """`payload` when its encoding fits `limit` bytes; else a cut copy that fits, with
    `truncated.original_bytes` (kept from an earlier cut, so a re-cut still names the true
    original). The input is never modified. Raises `Oversize` when no cut can make it fit."""
    size = encoded_size(payload)
    if size <= limit:
        return payload
    earlier = payload.get(TRUNCATED_KEY)
    original = size
    if isinstance(earlier, dict) and isinstance(earlier.get("original_bytes"), int):
        original = max(earlier["original_bytes"], size)
    work: dict[str, Any] = _copy_containers({k: v for k, v in payload.items() if k != TRUNCATED_KEY})
    note = {"original_bytes": original}
    # The note goes after the other fields: `,"truncated":{...}` (or without the comma when alone).
    target = limit - len(_encode({TRUNCATED_KEY: note}))
    excess = encoded_size(work) - target
    if excess > 0 and _cut_strings(work, excess) > 0:
        excess = encoded_size(work) - target  # measured, not estimated: the arrays' turn needs it
    elif excess > 0:
        excess = 0  # the strings' savings are exact (each cut string was measured)
    while excess > 0:
        if not _cut_arrays(work, excess) and not _drop_entries(work, excess):
            raise Oversize(f"payload of {size} bytes cannot be cut to {limit} bytes (identity fields too large)")
        excess = encoded_size(work) - target
    work[TRUNCATED_KEY] = note
    return work


# -- strings ------------------------------------------------------------------------------------------


def _copy_containers(value: Any) -> Any:
    """A copy of every dict and list (strings are immutable and shared)."""
    if isinstance(value, dict):
        return {k: _copy_containers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy_containers(v) for v in value]
    return value


def _slots(value: Any) -> Iterator[tuple[Any, Any]]:
    """(container, key-or-index) of every cuttable value, depth first, in document order."""
    if isinstance(value, dict):
        for key, child in value.items():
            if isinstance(key, str) and is_identity(key):
                continue
            yield value, key
            yield from _slots(child)
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield value, index
            yield from _slots(child)


def _cut_strings(work: dict[str, Any], excess: int) -> int:
    """Cut the longest strings by water-filling; returns the excess left (> 0: strings were not enough)."""
    leaves: list[tuple[int, int, Any, Any]] = []  # (content bytes, document order, container, key)
    for order, (container, key) in enumerate(_slots(work)):
        value = container[key]
        if isinstance(value, str):
            content = len(_encode(value)) - 2
            if content > _MARKER_BYTES:
                leaves.append((content, order, container, key))
    if not leaves:
        return excess
    # Longest first; equal lengths in document order, so the choice is deterministic.
    leaves.sort(key=lambda leaf: (-leaf[0], leaf[1]))
    level = _water_level([leaf[0] for leaf in leaves], excess)
    saved = 0
    for content, _, container, key in leaves:
        if content <= level:
            break
        new = _prefix(container[key], content, level - _MARKER_BYTES) + MARKER
        container[key] = new
        saved += content - (len(_encode(new)) - 2)
    return excess - saved


def _water_level(lengths: list[int], excess: int) -> int:
    """The highest level C >= the marker's size such that cutting every length above C down to C
    saves at least `excess` bytes (the marker's size when even that is not enough). `lengths` is
    sorted in decreasing order."""
    total = 0
    for k, length in enumerate(lengths, start=1):
        total += length
        nxt = lengths[k] if k < len(lengths) else _MARKER_BYTES
        nxt = max(nxt, _MARKER_BYTES)
        # With the k longest cut to C (nxt <= C <= length): saving = total - k*C.
        if total - k * nxt >= excess:
            return max(nxt, (total - excess) // k)
    return _MARKER_BYTES


def _prefix(text: str, content: int, budget: int) -> str:
    """The longest prefix of `text` (found in a few encodes) whose JSON content fits `budget` bytes."""
    if budget <= 0:
        return ""
    chars = min(len(text), budget * len(text) // max(content, 1))
    while chars > 0:
        size = len(_encode(text[:chars])) - 2
        if size <= budget:
            return text[:chars]
        chars = min(chars - 1, chars * budget // size)
    return ""


# -- arrays -------------------------------------------------------------------------------------------


def _cut_arrays(work: dict[str, Any], excess: int) -> bool:
    """Drop the tail elements of the longest arrays until `excess` bytes are saved (as estimated;
    the caller re-measures and calls again if the estimate fell short). False: no array to cut."""
    arrays: list[list[Any]] = []
    for container, key in _slots(work):
        if isinstance(container[key], list) and container[key]:
            arrays.append(container[key])
    if not arrays:
        return False
    sizes = {id(a): [len(_encode(e)) for e in a] for a in arrays}
    totals = {id(a): sum(sizes[id(a)]) + len(a) - 1 for a in arrays}
    heap = [(-totals[id(a)], order, order) for order, a in enumerate(arrays)]
    heapq.heapify(heap)
    dead: set[int] = set()
    removed: list[Any] = []  # kept alive, so no id() in `dead` is reused by a new object
    saved = 0
    while heap and saved < excess:
        neg, order, _ = heapq.heappop(heap)
        array = arrays[order]
        if id(array) in dead or not array or -neg != totals[id(array)]:
            continue
        element = array.pop()
        removed.append(element)
        size = sizes[id(array)].pop()
        step = size + (1 if array else 0)
        saved += step
        totals[id(array)] -= step
        dead.update(id(inner) for inner in _lists_in(element))
        if array:
            heapq.heappush(heap, (-totals[id(array)], order, order))
    return saved > 0


# -- nested entries -----------------------------------------------------------------------------------


def _drop_entries(work: dict[str, Any], excess: int) -> bool:
    """Last resort, when no string or array is left to cut: remove whole entries of nested objects
    (never a top-level field, never an identity field), largest first, until `excess` bytes are saved
    (as estimated). False: none is left. A skeleton of many short fields can otherwise not fit."""
    entries: list[tuple[int, int, dict[str, Any], str]] = []
    for order, (container, key) in enumerate(_slots(work)):
        if isinstance(container, dict) and container is not work:
            entries.append((-(len(_encode(key)) + len(_encode(container[key])) + 2), order, container, key))
    if not entries:
        return False
    entries.sort(key=lambda e: (e[0], e[1]))
    saved = 0
    gone: set[int] = set()  # containers inside a removed entry: their entries are gone with it
    removed: list[Any] = []  # kept alive, so no id() in `gone` is reused by a new object
    for neg, _, container, key in entries:
        if saved >= excess:
            break
        if id(container) in gone or key not in container:
            continue
        value = container.pop(key)
        removed.append(value)
        gone.update(id(d) for d in _dicts_in(value))
        saved += -neg
    return saved > 0


def _dicts_in(value: Any) -> Iterator[dict[str, Any]]:
    if isinstance(value, dict):
        yield value
        for child in value.values():
            yield from _dicts_in(child)
    elif isinstance(value, list):
        for child in value:
            yield from _dicts_in(child)


def _lists_in(value: Any) -> Iterator[list[Any]]:
    if isinstance(value, list):
        yield value
        for child in value:
            yield from _lists_in(child)
    elif isinstance(value, dict):
        for child in value.values():
            yield from _lists_in(child)


def shrink_event(body: bytes, limit: int) -> bytes | None:
    """An encoded event (envelope and payload) cut to at most `limit` bytes by cutting its payload;
    None when that is impossible. Deterministic: the same body and limit give the same bytes."""
    try:
        event = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return None
    payload = event.get("payload") if isinstance(event, dict) else None
    if not isinstance(payload, dict):
        return None
    envelope = len(body) - encoded_size(payload)
    try:
        event["payload"] = cut(payload, limit - envelope)
    except Oversize:
        return None
    out = _encode(event)
    return out if len(out) <= limit else None
