"""JSON Schemas of the wire contract, generated from the msgspec types of this package.

`documents()` returns one self-contained JSON Schema (draft 2020-12) per part of PROTOCOL.md: the
boot payload, every frame, every command and every event kind. The structs are the source of truth
(the driver decodes with them), so the schemas cannot drift from what the driver accepts and sends;
`schemas/` in the repository holds the output and a test regenerates and compares it
(`agent-driver schema --out schemas`).

What msgspec cannot say by itself is added here, by name: an `events` frame's events are the
envelope with the kind's own payload (the journal carries payloads as raw bytes), a `command` frame
is a command with `"type": "command"`, and every payload may carry the §4.3 `truncated` note.
Imported only by `agent-driver schema` and tests: never on the daemon's start.
"""

from __future__ import annotations

import copy
from typing import Any

import msgspec

from driver.protocol import boot, commands, events, frames

DIALECT = "https://json-schema.org/draft/2020-12/schema"
REF = "#/$defs/{name}"
Schema = dict[str, Any]


def _event_def(kind: str) -> str:
    return f"event.{kind}"


def _components() -> dict[str, Schema]:
    """Every named schema: msgspec's components plus the per-kind events and the wire's unions."""
    payloads = {k: spec.payload for k, spec in events.EVENT_KINDS.items()}
    types: list[Any] = [
        boot.BootPayload,
        frames.Hello,
        frames.Welcome,
        frames.Heartbeat,
        frames.CommandUpdate,
        frames.Receipt,
        frames.EventsFrame,
        events.Event,
        events.Truncated,
        *commands.Command.__args__,  # type: ignore[attr-defined]
        *payloads.values(),
    ]
    _, defs = msgspec.json.schema_components(types, ref_template=REF)
    defs = copy.deepcopy(defs)
    for payload in set(payloads.values()):
        # PROTOCOL §4.3: an event cut to fit says so in its payload, whatever its kind.
        defs[payload.__name__]["properties"]["truncated"] = {"$ref": REF.format(name="Truncated")}
    for kind, spec in events.EVENT_KINDS.items():
        envelope: Schema = {
            "title": kind,
            "description": f"The `{kind}` event ({spec.delivery}): the envelope with this kind's payload.",
            "allOf": [{"$ref": REF.format(name="Event")}],
            "properties": {
                "kind": {"const": kind},
                "delivery": {"const": spec.delivery},
                "payload": {"$ref": REF.format(name=spec.payload.__name__)},
            },
        }
        defs[_event_def(kind)] = envelope
    defs["AnyEvent"] = {
        "title": "AnyEvent",
        "description": "One event of any kind of PROTOCOL §4.2.",
        "oneOf": [{"$ref": REF.format(name=_event_def(k))} for k in events.EVENT_KINDS],
    }
    defs["EventsFrame"]["properties"]["events"] = {"type": "array", "items": {"$ref": REF.format(name="AnyEvent")}}
    command_names = [c.__name__ for c in commands.Command.__args__]  # type: ignore[attr-defined]
    defs["Command"] = {
        "title": "Command",
        "description": "One command of PROTOCOL §3 (as it arrives: `kind` picks the fields).",
        "oneOf": [{"$ref": REF.format(name=n)} for n in command_names],
    }
    defs["CommandFrame"] = {
        "title": "CommandFrame",
        "description": 'A `command` frame: a command with `type` "command".',
        "allOf": [{"$ref": REF.format(name="Command")}],
        "properties": {"type": {"const": "command"}},
        "required": ["type"],
    }
    return defs


FRAMES = ("Hello", "Welcome", "Heartbeat", "CommandUpdate", "Receipt", "EventsFrame", "CommandFrame")


def _document(title: str, description: str, root: Schema, defs: dict[str, Schema]) -> Schema:
    """A self-contained schema: `root` with the definitions it reaches (and nothing else)."""
    reached: dict[str, Schema] = {}
    todo = [root]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                name = ref.removeprefix("#/$defs/")
                if name not in reached:
                    reached[name] = defs[name]
                    todo.append(defs[name])
            todo.extend(node.values())
        elif isinstance(node, list):
            todo.extend(node)
    version = frames.PROTOCOL_VERSION
    head: Schema = {"$schema": DIALECT, "title": title, "description": f"{description} (protocol {version})"}
    return {**head, **root, "$defs": dict(sorted(reached.items()))}


def documents() -> dict[str, Schema]:
    """File name → schema: what `schemas/` holds."""
    defs = _components()

    def ref(name: str) -> Schema:
        return {"$ref": REF.format(name=name)}

    return {
        "boot.schema.json": _document(
            "Boot payload", "PROTOCOL §1: the one-time boot payload", ref("BootPayload"), defs
        ),
        "frames.schema.json": _document(
            "Frame",
            "PROTOCOL §2-§4: every frame on the link, either direction",
            {"oneOf": [ref(n) for n in FRAMES]},
            defs,
        ),
        "commands.schema.json": _document("Command", "PROTOCOL §3: every command kind", ref("Command"), defs),
        "events.schema.json": _document("Event", "PROTOCOL §4.2: every event kind", ref("AnyEvent"), defs),
    }


def render(doc: Schema) -> str:
    """The canonical text of a schema file (stable, so a regenerated file compares byte for byte)."""
    return msgspec.json.format(msgspec.json.encode(doc), indent=2).decode() + "\n"
