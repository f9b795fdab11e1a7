"""docs/transcript.md is what the real driver and the reference control plane say (issue 35).

The flow of tests/protocol/transcript.py runs again (real driver, stubborn ACP agent, reference CP,
a recording relay between them); the test fails when a frame or event kind appears or disappears, or
when a field is added, removed or changes its JSON type, and names it. Every frame recorded in the
fresh run, and every frame in the file, must validate against schemas/frames.schema.json.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.protocol import transcript

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "transcript.md"
REGENERATE = os.environ.get("AGENT_DRIVER_REGENERATE_TRANSCRIPT") == "1"
# Present in some runs and not in others (best-effort, or emitted only when the machine is slow).
OPTIONAL = {"event log.records", "event message.delta", "event diagnostic.reported"}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def frame_shape(sig: str, frame: dict[str, Any]) -> Any:
    # An events frame's events are compared one by one, by kind (batching differs between runs).
    return transcript.shape({**frame, "events": []} if sig == "events" else frame)


def frames_validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(json.loads((ROOT / "schemas" / "frames.schema.json").read_text()))


async def test_a_fresh_run_has_the_transcripts_frames_and_shapes(tmp_path: Path) -> None:
    entries = await transcript.record(tmp_path)
    if REGENERATE:
        DOC.write_text(transcript.render(entries))
    documented = transcript.parse(DOC.read_text())
    v = frames_validator()
    for e in entries:
        if "close_code" not in e.frame:
            v.validate(e.frame)
    fresh: dict[str, tuple[str, Any]] = {}
    for _, direction, sig, frame in transcript.items(entries):
        old = fresh.get(sig, (direction, None))[1]
        fresh[sig] = (direction, transcript.merge(old, frame_shape(sig, frame)))
    missing = documented.keys() - fresh.keys() - OPTIONAL
    new = fresh.keys() - documented.keys() - OPTIONAL
    assert not missing and not new, f"not in this run: {sorted(missing)}; not in {DOC.name}: {sorted(new)}"
    problems = []
    for sig, (direction, frame) in documented.items():
        if sig not in fresh:
            continue
        assert fresh[sig][0] == direction, sig
        problems += [f"{sig}: {d}" for d in transcript.differences(frame_shape(sig, frame), fresh[sig][1])]
    assert not problems, "\n".join(problems)
    # The close codes the driver obeys, with the exit status the README lists.
    closes = {e.frame["close_code"]: e.frame["driver_exit"] for e in entries if "close_code" in e.frame}
    redials = {code: None for code in (1012, 4400, 1011, 1013, 1001)}
    assert closes == {**redials, 4409: 75, 4410: 0, 4401: 77, 4403: 77}


def test_every_frame_of_the_transcript_validates_against_the_schema() -> None:
    v = frames_validator()
    documented = transcript.parse(DOC.read_text())
    for sig, (_, frame) in documented.items():
        if not sig.startswith(("close ", "event ")):
            v.validate(frame)
    for sig, (_, event) in documented.items():
        if sig.startswith("event "):
            v.validate({"type": "events", "batch": 1, "events": [event]})
    assert {"hello", "welcome", "events", "receipt", "heartbeat", "command input.start"} <= documented.keys()
    assert {"command.update accepted", "command.update completed", "close 4409"} <= documented.keys()
