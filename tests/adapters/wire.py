"""What the driver writes to a runtime, captured from real sessions, checked against the runtime's own
published schema (PROTOCOL conformance, issue 12).

- `capture(monkeypatch)` records every JSON-RPC message a `JsonRpcPeer` sends (requests,
  notifications, and our answers to the runtime's requests, each with the method it answers).
- `codex_schema(dir)` generates Codex's schema from the pinned binary (`codex app-server
  generate-json-schema`); `acp_schema()` reads the pinned `@agentclientprotocol/sdk` schema file and
  checks its hash.
- Validation is strict about field names: every object schema that lists properties gets
  `unevaluatedProperties: false` (JSON Schema 2020-12), so a misnamed optional field, which a tolerant
  runtime would silently ignore, fails here.
"""

from __future__ import annotations

import copy
import hashlib
import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from driver.adapters.common.jsonrpc import JsonRpcPeer

ROOT = Path(__file__).resolve().parents[2]
ACP_SDK = ROOT / "node_modules" / "@agentclientprotocol" / "sdk"
ACP_SCHEMA = ACP_SDK / "schema" / "v1" / "schema.json"
# Pinned with the package version in package.json: a new schema must be looked at, not slip in.
ACP_SDK_VERSION = "2.4.0"
ACP_SCHEMA_SHA256 = "0d0b1ca83c4872e5473f68926a894c7a8203b59b118e2a79bfe43dd76fbcbc1a"
# The same package's schema of unstable additions, used only for the unstable fields below, which the
# driver sends only to an agent that advertises them (`sessionCapabilities.systemPrompt`).
ACP_UNSTABLE_SCHEMA = ACP_SCHEMA.with_name("schema.unstable.json")
ACP_UNSTABLE_SHA256 = "ce7881d10c854bcac4f0e7d3a9ce4fb0f612ec0a09e64b572940beec4668c189"
ACP_UNSTABLE_FIELDS = frozenset({"systemPrompt"})


@dataclass
class Sent:
    peer: str
    kind: str  # "request" | "notification" | "response"
    method: str  # for a response: the method of the request it answers
    body: dict[str, Any]


@dataclass
class Capture:
    sent: list[Sent] = field(default_factory=list)

    def methods(self, kind: str) -> set[str]:
        return {s.method for s in self.sent if s.kind == kind}


def capture(monkeypatch: pytest.MonkeyPatch) -> Capture:
    """Record every message any JsonRpcPeer sends while the test runs."""
    record = Capture()
    answering: dict[tuple[int, Any], str] = {}
    original_send = JsonRpcPeer._send
    original_handle = JsonRpcPeer._handle_request

    async def send(self: JsonRpcPeer, message: dict[str, Any]) -> None:
        body = json.loads(json.dumps(message))
        if "method" in body:
            kind = "request" if "id" in body else "notification"
            record.sent.append(Sent(self.name, kind, body["method"], body))
        else:
            method = answering.pop((id(self), body.get("id")), "?")
            record.sent.append(Sent(self.name, "response", method, body))
        await original_send(self, message)

    async def handle(self: JsonRpcPeer, request_id: Any, method: str, params: Any, scope: Any) -> None:
        answering[(id(self), request_id)] = method
        await original_handle(self, request_id, method, params, scope)

    monkeypatch.setattr(JsonRpcPeer, "_send", send)
    monkeypatch.setattr(JsonRpcPeer, "_handle_request", handle)
    return record


def strict(schema: Any, *, root: bool = True) -> Any:
    """A copy where every schema in a value position (the root, a property's, an array item's, a map
    value's) refuses properties that nothing in it evaluated. Only value positions: a definition used
    as an `allOf` member or a union branch sees just part of the object, and `unevaluatedProperties`
    at the value position already looks through `$ref`, `allOf`, `anyOf` and `oneOf`."""
    schema = copy.deepcopy(schema)

    def mark(node: Any) -> None:
        if isinstance(node, dict) and node.get("additionalProperties") is None:
            node.setdefault("unevaluatedProperties", False)

    def walk(node: Any) -> None:
        if isinstance(node, list):
            for value in node:
                walk(value)
            return
        if not isinstance(node, dict):
            return
        for key, value in node.items():
            if key == "properties" and isinstance(value, dict):
                for sub in value.values():
                    mark(sub)
            elif key in ("items", "additionalProperties") and isinstance(value, dict):
                mark(value)
            elif key == "prefixItems" and isinstance(value, list):
                for sub in value:
                    mark(sub)
            walk(value)

    walk(schema)
    if root:
        mark(schema)
    return schema


def errors(schema: dict[str, Any], instance: Any) -> list[str]:
    validator = jsonschema.Draft202012Validator(schema)
    return [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in validator.iter_errors(instance)]


# ---- Codex ------------------------------------------------------------------------------------


def codex_schema(binary: Path, out: Path) -> Path:
    subprocess.run([str(binary), "app-server", "generate-json-schema", "--out", str(out)], check=True, timeout=60)
    return out


def _union_methods(path: Path) -> dict[str, str]:
    """method -> the `$ref` name of its params, from a generated ClientRequest/ServerRequest/... union."""
    doc = json.loads(path.read_text())
    out: dict[str, str] = {}
    for variant in doc.get("oneOf", []):
        props = variant.get("properties", {})
        method = props.get("method", {})
        name = (method.get("enum") or [method.get("const")])[0]
        ref = props.get("params", {}).get("$ref", "")
        out[name] = ref.rsplit("/", 1)[-1]
    return out


def codex_methods(schema_dir: Path, union: str) -> set[str]:
    """The methods of one union: ClientRequest, ClientNotification, ServerRequest, ServerNotification."""
    return set(_union_methods(schema_dir / f"{union}.json"))


def codex_check(schema_dir: Path, sent: Sent) -> list[str]:
    """What is wrong with one message the driver sent to Codex, per the generated schema."""
    if sent.kind in ("request", "notification"):
        union = "ClientRequest" if sent.kind == "request" else "ClientNotification"
        if sent.method not in codex_methods(schema_dir, union):
            return [f"{sent.method} is not a {union} method"]
        return errors(strict(json.loads((schema_dir / f"{union}.json").read_text())), sent.body)
    if "error" in sent.body:
        error = sent.body["error"]
        ok = isinstance(error.get("code"), int) and isinstance(error.get("message"), str)
        return [] if ok else [f"malformed error answer {error!r}"]
    params = _union_methods(schema_dir / "ServerRequest.json").get(sent.method)
    if params is None:
        return [f"{sent.method} is not a ServerRequest method"]
    response = schema_dir / f"{params.removesuffix('Params')}Response.json"
    return errors(strict(json.loads(response.read_text())), sent.body.get("result"))


# ---- ACP --------------------------------------------------------------------------------------


def _pinned(path: Path, sha256: str) -> dict[str, Any]:
    data = path.read_bytes()
    assert hashlib.sha256(data).hexdigest() == sha256, f"{path.name} changed: review it, re-pin its hash"
    schema: dict[str, Any] = json.loads(data)
    return schema


def acp_schema(*, unstable: bool = False) -> dict[str, Any]:
    version = json.loads((ACP_SDK / "package.json").read_text())["version"]
    assert version == ACP_SDK_VERSION, f"@agentclientprotocol/sdk is {version}, pinned {ACP_SDK_VERSION}"
    if unstable:
        return _pinned(ACP_UNSTABLE_SCHEMA, ACP_UNSTABLE_SHA256)
    return _pinned(ACP_SCHEMA, ACP_SCHEMA_SHA256)


def acp_defs_by_method(schema: dict[str, Any], side: str, suffix: str) -> dict[str, str]:
    """method -> definition name, for the messages handled by `side` ("agent": we send them;
    "client": the agent sends them to us) whose definition name ends with `suffix`."""
    return {
        d["x-method"]: name
        for name, d in schema["$defs"].items()
        if d.get("x-side") == side and "x-method" in d and name.endswith(suffix)
    }


def acp_check(schema: dict[str, Any], sent: Sent) -> list[str]:
    """What is wrong with one message the driver sent to an ACP agent, per the pinned schema (the
    unstable one for a message carrying one of ACP_UNSTABLE_FIELDS)."""
    params = sent.body.get("params")
    if isinstance(params, dict) and ACP_UNSTABLE_FIELDS & params.keys() and schema is not _UNSTABLE:
        return acp_check(_UNSTABLE, sent)
    return _acp_check(schema, sent)


def _acp_check(schema: dict[str, Any], sent: Sent) -> list[str]:
    if sent.kind == "response":
        if "error" in sent.body:
            error = sent.body["error"]
            ok = isinstance(error.get("code"), int) and isinstance(error.get("message"), str)
            return [] if ok else [f"malformed error answer {error!r}"]
        names = acp_defs_by_method(schema, "client", "Response")
        target, value = names.get(sent.method), sent.body.get("result")
    else:
        names = acp_defs_by_method(schema, "agent", "Request" if sent.kind == "request" else "Notification")
        target, value = names.get(sent.method), sent.body.get("params")
    if target is None:
        return [f"{sent.method} is not an ACP {sent.kind} the client may send"]
    if sent.body.get("jsonrpc") != "2.0":
        return ['missing "jsonrpc": "2.0"']
    wrapper = {"$schema": schema["$schema"], "$defs": strict(schema["$defs"], root=False), "$ref": f"#/$defs/{target}"}
    return errors(strict(wrapper, root=False) | {"unevaluatedProperties": False}, value)


_UNSTABLE = acp_schema(unstable=True) if ACP_UNSTABLE_SCHEMA.exists() else {}


def problems(checks: Iterator[tuple[Sent, list[str]]]) -> list[str]:
    return [f"{s.kind} {s.method}: {e} in {json.dumps(s.body)[:400]}" for s, errs in checks for e in errs]
