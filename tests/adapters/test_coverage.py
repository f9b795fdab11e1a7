"""Nothing a runtime reports is dropped unknowingly: every notification and server request in each
runtime's own schema has a row in docs/providers.md ("Coverage") saying which event it becomes or why
it is ignored, and every row names something the schema has."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import claude_agent_sdk as sdk
import pytest

from driver.adapters.codex.adapter import codex_binary
from driver.protocol.events import EVENT_KINDS
from tests.adapters import wire

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "providers.md"
_ROW = re.compile(r"^\| `([^`]+)` \| (.+) \|$")


def table(heading: str) -> dict[str, str]:
    """First-column name -> second column, for every table row under `### heading` (to the next heading)."""
    text = DOC.read_text()
    start = text.index(f"### {heading}\n")
    end = text.find("\n#", start + 1)
    rows: dict[str, str] = {}
    for line in text[start : end if end != -1 else None].splitlines():
        if m := _ROW.match(line.strip()):
            assert m.group(1) not in rows, f"{heading}: {m.group(1)} has two rows"
            rows[m.group(1)] = m.group(2)
    return rows


def check(rows: dict[str, str], schema: set[str]) -> None:
    assert sorted(schema - rows.keys()) == [], "in the schema but neither mapped nor listed as ignored"
    assert sorted(rows.keys() - schema) == [], "in the table but not in the schema (stale rows)"
    for name, becomes in rows.items():
        named = set(re.findall(r"`([a-z_]+(?:\.[a-z_]+)+)`", becomes))
        if becomes.startswith(("ignored", "refused", "by variant")):
            continue
        # A mapped row names the events it becomes (all of them real kinds), or the port that answers.
        assert named or "port" in becomes or "no event" in becomes, f"{name}: says neither event nor reason"
        unknown = {k for k in named if k.split(".")[0] in {k2.split(".")[0] for k2 in EVENT_KINDS}} - set(EVENT_KINDS)
        assert not unknown, f"{name}: names unknown event kinds {unknown}"


def test_codex_every_notification_and_server_request(tmp_path: Path) -> None:
    schema = wire.codex_schema(codex_binary(ROOT), tmp_path)
    methods = wire.codex_methods(schema, "ServerNotification") | wire.codex_methods(schema, "ServerRequest")
    assert len(methods) > 50  # the generator ran and the unions were read
    check(table("Codex app-server"), methods)


def test_acp_every_agent_message_and_session_update() -> None:
    schema = wire.acp_schema()
    methods = set(wire.acp_defs_by_method(schema, "client", "Request"))
    methods |= set(wire.acp_defs_by_method(schema, "client", "Notification"))
    methods |= {d["x-method"] for d in schema["$defs"].values() if d.get("x-side") == "protocol"}
    variants = {o["properties"]["sessionUpdate"]["const"] for o in schema["$defs"]["SessionUpdate"]["oneOf"]}
    assert "session/update" in methods and "tool_call" in variants
    rows = table("ACP")
    check({k: v for k, v in rows.items() if k not in variants}, methods)
    check({k: v for k, v in rows.items() if k in variants}, variants)


def test_claude_every_sdk_message_type() -> None:
    union = {t.__name__ for t in typing.get_args(sdk.types.Message)}
    system = {t.__name__ for t in sdk.SystemMessage.__subclasses__()}
    assert {"AssistantMessage", "ResultMessage", "TaskStartedMessage"} <= union | system
    check(table("Claude Agent SDK messages"), union | system)


@pytest.mark.parametrize("heading", ["Claude Agent SDK messages", "Codex app-server", "ACP"])
def test_tables_parse(heading: str) -> None:
    assert len(table(heading)) >= 10
