"""Hypothesis strategies for what a control plane can send (issue 11, fuzz): every frame type with
random, missing, wrongly typed, oversized, deeply nested and unknown fields, unknown types, non-JSON
text and binary frames.

A frame is `(data, text)`: the bytes and whether they go out as a text frame. Frames that would end
the link (invalid UTF-8, a second `welcome`, over 4 MiB) are not drawn here: the suite sends them one
at a time, so that reconnect backoff does not dominate its run time.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

Frame = tuple[bytes, bool]

# Kinds that would end the session or the run under test if their random body happened to be valid.
SAFE_KINDS = ["input.start", "permission.resolve", "host_tool.result"]
FIELDS = [
    "run_id",
    "input",
    "request_id",
    "option_id",
    "call_id",
    "content",
    "is_error",
    "reason",
    "text",
    "attachments",
]

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40)
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=16,
)


deep_values = st.integers(min_value=1000, max_value=5000).map(lambda n: "[" * n + "]" * n)
ids = st.text(min_size=1, max_size=40) | json_values
seqs = st.integers(min_value=1, max_value=2**63 - 1) | st.integers(min_value=-(2**80), max_value=2**80) | json_values
kinds = st.sampled_from(SAFE_KINDS) | st.text(max_size=20) | json_values
field_names = st.sampled_from(FIELDS) | st.text(max_size=12)


@st.composite
def command_frames(draw: st.DrawFn) -> Frame:
    frame: dict[str, Any] = {"type": "command", "command_id": draw(ids), "seq": draw(seqs), "kind": draw(kinds)}
    frame.update(draw(st.dictionaries(field_names, json_values, max_size=5)))
    for key in draw(st.sets(st.sampled_from(["type", "command_id", "seq", "kind"]), max_size=2)):
        frame.pop(key, None)
    return _encode(frame, draw)


@st.composite
def receipt_frames(draw: st.DrawFn) -> Frame:
    frame: dict[str, Any] = {"type": "receipt"}
    frame.update(
        draw(
            st.fixed_dictionaries(
                {},
                optional={
                    "batch": st.integers(min_value=-(2**70), max_value=2**70) | json_values,
                    # Random ids never match a real event's `instance/epoch/seq`: nothing real is receipted.
                    "accepted": st.lists(st.text(max_size=20), max_size=5) | json_values,
                    "rejected": st.lists(
                        st.fixed_dictionaries({"event_id": st.text(max_size=20)}, optional={"code": json_values}),
                        max_size=3,
                    )
                    | json_values,
                },
            )
        )
    )
    frame.update(draw(st.dictionaries(st.text(max_size=12), json_values, max_size=3)))
    return _encode(frame, draw)


@st.composite
def unknown_frames(draw: st.DrawFn) -> Frame:
    frame = draw(st.dictionaries(st.text(max_size=12), json_values, max_size=5))
    frame["type"] = draw(
        st.text(max_size=20).filter(lambda t: t not in ("welcome", "command", "receipt")) | json_values
    )
    return _encode(frame, draw)


def _encode(frame: dict[str, Any], draw: st.DrawFn) -> Frame:
    """JSON text, sometimes with a deeply nested field spliced in (json.dumps itself recurses)."""
    data = json.dumps(frame)
    if draw(st.integers(min_value=0, max_value=9)) == 0 and data.endswith("}") and len(data) > 2:
        data = data[:-1] + ', "deep": ' + draw(deep_values) + "}"
    return data.encode(), True


non_json = st.binary(max_size=300).map(lambda b: (b, False)) | st.text(max_size=300).map(lambda t: (t.encode(), True))
top_level_deep = deep_values.map(lambda d: (d.encode(), True))
scalar_json = json_values.map(lambda v: (json.dumps(v).encode(), True))

cp_frames = st.one_of(command_frames(), receipt_frames(), unknown_frames(), non_json, top_level_deep, scalar_json)


def oversized_command(size: int) -> Frame:
    """A command just under `size` bytes (the driver's frame limit is 4 MiB), with an invalid kind."""
    frame = {"type": "command", "command_id": "big-1", "seq": 1, "kind": "no.such.kind", "pad": ""}
    overhead = len(json.dumps(frame))
    frame["pad"] = "x" * (size - overhead)
    return json.dumps(frame).encode(), True
