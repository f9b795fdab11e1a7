"""PROTOCOL §4.3's cutter: always fits, identity fields intact, deterministic, fast on 50 MiB."""

from __future__ import annotations

import copy
import time
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from driver.protocol import oversize
from driver.protocol.oversize import MARKER, Oversize, cut, encoded_size


def _identity_values(value: Any, out: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    if isinstance(value, dict):
        for k, v in value.items():
            if oversize.is_identity(k):
                out.append((k, v))
            else:
                _identity_values(v, out)
    elif isinstance(value, list):
        for v in value:
            _identity_values(v, out)
    return out


keys = st.sampled_from(["text", "output", "items", "kind", "status", "code", "tool_call_id", "a", "b"])
leaves = st.one_of(st.text(max_size=300), st.integers(), st.booleans(), st.none())
values = st.recursive(
    leaves,
    lambda inner: st.one_of(st.lists(inner, max_size=12), st.dictionaries(keys, inner, max_size=6)),
    max_leaves=60,
)
payloads = st.dictionaries(keys, values, max_size=6)


def _small_identity(payload: dict[str, Any]) -> bool:
    return encoded_size(_identity_values(payload, [])) < 200


@settings(max_examples=300, deadline=None)
@given(payloads, st.integers(min_value=400, max_value=3000))
def test_always_fits_keeps_identity_and_is_deterministic(payload: dict[str, Any], limit: int) -> None:
    if not _small_identity(payload):
        return
    before = copy.deepcopy(payload)
    out = cut(payload, limit)
    assert payload == before  # the input is never modified
    assert encoded_size(out) <= limit
    assert cut(copy.deepcopy(payload), limit) == out  # deterministic
    if encoded_size(payload) <= limit:
        assert out is payload
    else:
        assert out["truncated"] == {"original_bytes": encoded_size(payload)}
        # Identity fields are never cut (an array holding them may lose its tail, never change them).
        kept = _identity_values({k: v for k, v in out.items() if k != "truncated"}, [])
        original = _identity_values(payload, [])
        assert all(item in original for item in kept)
        top = {k: v for k, v in payload.items() if oversize.is_identity(k)}
        assert all(out[k] == v for k, v in top.items())


def test_longest_strings_are_cut_first_and_short_ones_are_untouched() -> None:
    payload = {
        "tool_call_id": "call-1",
        "status": "completed",
        "output": "x" * 100_000,
        "title": "short",
        "b": "y" * 5000,
    }
    out = cut(payload, 4096)
    assert encoded_size(out) <= 4096
    assert out["title"] == "short" and out["tool_call_id"] == "call-1" and out["status"] == "completed"
    assert out["output"].endswith(MARKER) and out["output"].startswith("x")
    # Water-filling: both long strings end at the same level; the longer lost far more.
    assert abs(len(out["output"]) - len(out["b"])) <= 1
    assert out["truncated"] == {"original_bytes": encoded_size(payload)}


def test_nested_strings_are_cut_and_then_array_tails_go() -> None:
    nested = {"output": {"content": [{"type": "text", "text": "z" * 200_000}]}, "kind": "k"}
    out = cut(nested, 2000)
    assert encoded_size(out) <= 2000 and out["kind"] == "k"
    assert out["output"]["content"][0]["text"].endswith(MARKER)
    many = {"entries": [{"content": "e", "status": "pending"} for _ in range(10_000)], "plan_id": "p"}
    out = cut(many, 3000)
    assert encoded_size(out) <= 3000
    assert 0 < len(out["entries"]) < 10_000
    assert out["entries"] == many["entries"][: len(out["entries"])]  # the tail went, the head is intact


def test_a_cut_of_a_cut_keeps_the_true_original_size() -> None:
    payload = {"text": "q" * 50_000}
    once = cut(payload, 10_000)
    twice = cut(once, 2_000)
    assert twice["truncated"]["original_bytes"] == encoded_size(payload)
    assert encoded_size(twice) <= 2_000


def test_identity_fields_too_large_to_fit_are_refused() -> None:
    with pytest.raises(Oversize):
        cut({"message_id": "m" * 10_000, "text": "t"}, 1000)


def test_escapes_and_multibyte_text_are_measured_as_encoded() -> None:
    payload = {"text": '"\n\\é漢😀' * 40_000}
    out = cut(payload, 5000)
    assert encoded_size(out) <= 5000
    assert msgspec.json.decode(msgspec.json.encode(out)) == out


@pytest.mark.serial  # 50 MiB cut within 5 s
@pytest.mark.parametrize("shape", ["one_string", "nested"])
def test_fifty_mebibytes_are_cut_fast(shape: str) -> None:
    size = 50 * 1024 * 1024
    if shape == "one_string":
        payload: dict[str, Any] = {"tool_call_id": "c", "status": "completed", "output": "o" * size}
    else:
        # 50 MiB as 200 nested documents of 256 KiB each: many strings, arrays, objects.
        doc = {"type": "text", "text": "n" * (256 * 1024), "meta": {"lines": ["l" * 80] * 16}}
        payload = {"tool_call_id": "c", "output": {"content": [dict(doc) for _ in range(200)]}}
    started = time.perf_counter()
    out = cut(payload, 256 * 1024)
    elapsed = time.perf_counter() - started
    assert encoded_size(out) <= 256 * 1024
    print(f"cut 50 MiB ({shape}) to 256 KiB in {elapsed * 1000:.0f} ms")
    assert elapsed < 5.0  # linear: well under a second here; quadratic re-encoding would take minutes


def test_a_skeleton_of_short_fields_loses_nested_entries_not_its_identity() -> None:
    # Found by the property above: nothing long to cut, only many short fields in nested objects.
    payload = {
        "text": [],
        "output": {
            "text": {"text": "", "output": "", "items": "0\x1fࠀ𐀀", "kind": "", "status": "0ࠀࠀࠀࠀ", "code": "0" * 5},
            "output": {"text": None, "output": "", "items": "", "kind": "0\x1f", "status": "0" * 10},
            "items": {"text": None, "output": "", "items": "0" * 14 + "\x1f" * 4 + "\x07", "kind": "", "status": None},
        },
        "tool_call_id": "",
        "items": None,
        "kind": "",
    }
    out = oversize.cut(payload, 300)
    assert encoded_size(out) <= 300
    assert out["tool_call_id"] == "" and out["kind"] == "" and set(out) >= {"text", "output", "items"}
    assert out["truncated"]["original_bytes"] == encoded_size(payload)
    assert oversize.cut(payload, 300) == out  # deterministic
