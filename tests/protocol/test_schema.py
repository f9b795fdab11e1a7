"""The JSON Schemas in `schemas/` are the msgspec types of driver/protocol/, regenerated (issue 35).

They are what a control-plane author validates against, so they must say what the driver's own
decoders say: the files are regenerated and compared byte for byte, and samples the decoders accept
(or refuse) are accepted (or refused) by the schemas too.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import msgspec
import pytest

from driver.protocol import boot, commands, events
from driver.protocol.schema import documents, render

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ROOT / "schemas"
REGENERATE = "agent-driver schema --out schemas"


def validator(name: str) -> jsonschema.Draft202012Validator:
    schema = json.loads((SCHEMAS / name).read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_the_files_are_the_generated_schemas() -> None:
    docs = documents()
    assert sorted(p.name for p in SCHEMAS.iterdir()) == sorted(docs), f"regenerate: {REGENERATE}"
    for name, doc in docs.items():
        assert (SCHEMAS / name).read_text() == render(doc), f"{name} is stale; regenerate: {REGENERATE}"


def test_the_subcommand_writes_the_same_files(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "driver.cli", "schema", "--out", str(tmp_path)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    for path in SCHEMAS.iterdir():
        assert (tmp_path / path.name).read_text() == path.read_text()
    printed = subprocess.run([sys.executable, "-m", "driver.cli", "schema"], capture_output=True, text=True)
    assert json.loads(printed.stdout).keys() == documents().keys()


def boot_sample() -> dict[str, Any]:
    return {
        "protocol": 1,
        "driver_instance_id": "drv-1",
        "control": {"url": "ws://127.0.0.1:1/driver", "token": "t"},
        "session": {"id": "ses-1", "agent_id": "agt-1", "kind": "cattle", "cwd": "/w", "state_dir": "/w/.s"},
        "execution": {"revision": "rev-1", "runtime": "acp", "acp": {"command": ["agent"]}},
    }


def test_boot_schema_agrees_with_the_decoder_on_typos_at_every_depth() -> None:
    v = validator("boot.schema.json")
    good = boot_sample()
    msgspec.convert(good, boot.BootPayload)
    v.validate(good)
    top_typo = {**good, "sesion": good["session"]}
    nested_typo = {**good, "control": {**good["control"], "tokn": "x"}}
    bad_kind = {**good, "session": {**good["session"], "kind": "horse"}}
    for bad in (top_typo, nested_typo, bad_kind):
        with pytest.raises(msgspec.ValidationError):
            msgspec.convert(bad, boot.BootPayload)
        assert list(v.iter_errors(bad)), bad


def test_every_command_kind_has_a_schema_that_accepts_a_decoded_sample_and_refuses_a_missing_field() -> None:
    v = validator("commands.schema.json")
    samples: dict[str, dict[str, Any]] = {
        "input.start": {"run_id": "r", "input": {"text": "hi"}},
        "input.steer": {"run_id": "r", "input": {"text": "more"}},
        "turn.cancel": {"run_id": "r"},
        "permission.resolve": {"request_id": "p", "option_id": "allow"},
        "host_tool.result": {"call_id": "c", "content": [{"type": "text", "text": "ok"}]},
        "session.reset": {},
        "session.stop": {"reason": "done"},
        "process.start": {"process_id": "p1", "argv": ["sh"]},
        "process.input": {"process_id": "p1", "data": "ls\n"},
        "process.resize": {"process_id": "p1", "cols": 80, "rows": 24},
        "process.signal": {"process_id": "p1", "signal": "TERM"},
        "process.replay": {"process_id": "p1"},
    }
    assert sorted(samples) == sorted(commands.COMMAND_KINDS)
    for seq, (kind, fields) in enumerate(samples.items(), start=1):
        cmd = {"command_id": f"cmd-{seq}", "seq": seq, "kind": kind, **fields}
        commands.decode_command(json.dumps(cmd))
        v.validate(cmd)
        del cmd["command_id"]
        with pytest.raises(commands.CommandInvalid):
            commands.decode_command(json.dumps(cmd))
        assert list(v.iter_errors(cmd)), kind
    assert list(v.iter_errors({"command_id": "c", "seq": 1, "kind": "input.stat", "run_id": "r"}))


def test_event_schema_ties_each_kind_to_its_payload_and_delivery() -> None:
    v = validator("events.schema.json")
    payload = {"message_id": "m", "role": "assistant", "text": "hi"}
    validated = json.loads(events.validate_payload("message.completed", payload))
    event = {
        "event_id": "drv-1/1/000001",
        "seq": 1,
        "epoch": 1,
        "kind": "message.completed",
        "delivery": "lossless",
        "session_id": "ses-1",
        "run_id": "r",
        "occurred_at": "2026-01-01T00:00:00.000Z",
        "payload": validated,
    }
    v.validate(event)
    v.validate({**event, "payload": {**validated, "truncated": {"original_bytes": 9}}})
    assert list(v.iter_errors({**event, "delivery": "best_effort"}))
    assert list(v.iter_errors({**event, "payload": {**validated, "txet": "x"}}))
    assert list(v.iter_errors({**event, "kind": "message.complete"}))
    defs = json.loads((SCHEMAS / "events.schema.json").read_text())["$defs"]
    assert {f"event.{k}" for k in events.EVENT_KINDS} <= defs.keys()
