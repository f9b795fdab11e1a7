"""Codex settings: the execution snapshot -> `config.toml` text and thread parameters (no I/O).

Codex reads its configuration from `$CODEX_HOME/config.toml`. We generate one per session so the
binary never touches the user's home, never phones home (update checks, analytics, plugin sync from
GitHub) and talks only to the model endpoint named in `execution.provider_options`.

Supported `provider_options` keys (all optional):
- `base_url`: the Responses API root including `/v1` (e.g. the fake's `base_url`). When absent, Codex
  uses its built-in OpenAI provider.
- `env_key`: the environment variable holding the API key (default `OPENAI_API_KEY`); it must be set in
  `execution.environment`, and only its name is written to disk.
- `wire_api`: default `"responses"`.
- `model`: used when `execution.model` is empty (default `gpt-5.5`, a model Codex knows, so it offers
  its native tools such as `apply_patch`).
- `approval_policy`, `sandbox`: override what `permission_policy` implies (see `thread_policy`).
- `reasoning_summary`: `auto` | `concise` | `detailed` | `none` (default `auto`).
- `request_max_retries`, `stream_max_retries` (default 0: the driver reports failures, it does not hide
  them behind retries), `stream_idle_timeout_ms`.
- `config`: a table of extra Codex config overrides passed with `thread/start` / `thread/resume`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from driver.adapters.common.host_server import HOST_TOKEN_ENV
from driver.protocol.boot import ExecutionConfig, McpServer

PROVIDER_ID = "agent-driver"
DEFAULT_MODEL = "gpt-5.5"
DEFAULT_ENV_KEY = "OPENAI_API_KEY"

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


class CodexConfigError(ValueError):
    """provider_options or mcp_servers cannot be expressed as a Codex configuration."""


@dataclass(frozen=True, slots=True)
class CodexSettings:
    model: str
    base_url: str | None
    env_key: str
    wire_api: str
    approval_policy: str
    sandbox: str
    reasoning_summary: str
    request_max_retries: int
    stream_max_retries: int
    stream_idle_timeout_ms: int | None
    config_overrides: dict[str, Any] = field(default_factory=dict)


def thread_policy(permission_policy: str) -> tuple[str, str]:
    """(approval policy, sandbox mode) for our permission policy.

    full_access: Codex never asks and runs unsandboxed. supervised: "untrusted" asks before every
    command that is not known to be read-only and before file changes; the workspace-write sandbox
    confines what approved commands may touch to the working directory."""
    if permission_policy == "full_access":
        return "never", "danger-full-access"
    return "untrusted", "workspace-write"


def _int(options: Mapping[str, Any], key: str, default: int | None) -> int | None:
    value = options.get(key, default)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise CodexConfigError(f"provider_options.{key} must be a non-negative integer")
    return value


def _str(options: Mapping[str, Any], key: str, default: str) -> str:
    value = options.get(key, default)
    if not isinstance(value, str) or not value:
        raise CodexConfigError(f"provider_options.{key} must be a non-empty string")
    return value


def settings_from(execution: ExecutionConfig) -> CodexSettings:
    options = execution.provider_options
    approval, sandbox = thread_policy(execution.permission_policy)
    base_url = options.get("base_url")
    if base_url is not None and (not isinstance(base_url, str) or not base_url.startswith(("http://", "https://"))):
        raise CodexConfigError("provider_options.base_url must be an http(s) URL")
    overrides = options.get("config", {})
    if not isinstance(overrides, dict):
        raise CodexConfigError("provider_options.config must be a table")
    return CodexSettings(
        model=execution.model or _str(options, "model", DEFAULT_MODEL),
        base_url=base_url,
        env_key=_str(options, "env_key", DEFAULT_ENV_KEY),
        wire_api=_str(options, "wire_api", "responses"),
        approval_policy=_str(options, "approval_policy", approval),
        sandbox=_str(options, "sandbox", sandbox),
        reasoning_summary=_str(options, "reasoning_summary", "auto"),
        request_max_retries=_int(options, "request_max_retries", 0) or 0,
        stream_max_retries=_int(options, "stream_max_retries", 0) or 0,
        stream_idle_timeout_ms=_int(options, "stream_idle_timeout_ms", None),
        config_overrides=dict(overrides),
    )


# -- TOML writing (only the value shapes we produce) ---------------------------------------------


def _key(key: str) -> str:
    return key if _BARE_KEY.match(key) else json.dumps(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        # A JSON string with ASCII escapes is a valid TOML basic string.
        return json.dumps(value, ensure_ascii=True)
    if isinstance(value, Sequence):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{_key(str(k))} = {_value(v)}" for k, v in value.items()) + " }"
    raise CodexConfigError(f"cannot write {type(value).__name__} to config.toml")


def _table(name: str, values: Mapping[str, Any]) -> list[str]:
    lines = [f"[{name}]"]
    lines += [f"{_key(k)} = {_value(v)}" for k, v in values.items() if v is not None]
    return [*lines, ""]


def mcp_tables(servers: Sequence[McpServer], *, approve: bool = False) -> tuple[list[str], dict[str, str]]:
    """TOML tables for `[mcp_servers.*]`, and environment variables Codex must get for them.

    Secrets never go to disk: HTTP header values are named by environment variable
    (`env_http_headers`), and a stdio server's `env` values travel in Codex's own environment and are
    forwarded by name (`env_vars`). `approve`: Codex runs the servers' tools without asking."""
    lines: list[str] = []
    extra_env: dict[str, str] = {}
    for server in servers:
        name = f"mcp_servers.{_key(server.name)}"
        values: dict[str, Any]
        if server.transport == "http":
            if not server.url:
                raise CodexConfigError(f"mcp server {server.name!r}: url is required for http")
            values = {"url": server.url, "env_http_headers": dict(server.headers_from_env) or None}
        else:
            if not server.command:
                raise CodexConfigError(f"mcp server {server.name!r}: command is required for stdio")
            extra_env.update(server.env)
            values = {
                "command": server.command[0],
                "args": list(server.command[1:]),
                "env_vars": sorted(server.env) or None,
            }
        if approve:
            values["default_tools_approval_mode"] = "approve"
        lines += _table(name, values)
    return lines, extra_env



def render_config(
    settings: CodexSettings,
    mcp_servers: Sequence[McpServer] = (),
    host_mcp_url: str | None = None,
    otlp_endpoint: str | None = None,
) -> tuple[str, dict[str, str]]:
    """The config.toml text, and extra environment variables for the Codex process.

    Approval policy and sandbox go with `thread/start` instead: Codex 0.171 refuses
    `approval_policy = "untrusted"` in config.toml but honours it as a thread parameter."""
    top: dict[str, Any] = {
        "model": settings.model,
        "model_reasoning_summary": settings.reasoning_summary,
        "check_for_update_on_startup": False,
    }
    if settings.base_url is not None:
        top["model_provider"] = PROVIDER_ID
    lines = [f"{_key(k)} = {_value(v)}" for k, v in top.items()] + [""]
    if settings.base_url is not None:
        provider = {
            "name": PROVIDER_ID,
            "base_url": settings.base_url,
            "wire_api": settings.wire_api,
            "env_key": settings.env_key,
            "request_max_retries": settings.request_max_retries,
            "stream_max_retries": settings.stream_max_retries,
            "stream_idle_timeout_ms": settings.stream_idle_timeout_ms,
        }
        lines += _table(f"model_providers.{PROVIDER_ID}", provider)
    # Offline switches: plugins would sync from GitHub at every start; connection retries would turn an
    # unreachable endpoint into a long hang; the shell snapshot spawns a login shell per session.
    lines += _table("features", {"plugins": False, "unbounded_connection_retries": False, "shell_snapshot": False})
    lines += _table("analytics", {"enabled": False})
    if otlp_endpoint:
        # Codex's own spans go to the driver's collector (PROTOCOL §6.6), parented by the `trace` field
        # of each turn/start. Traces only; header values would have to be written here, so none are.
        exporter = {
            "otlp-http": {"endpoint": otlp_endpoint.rstrip("/") + "/v1/traces", "protocol": "binary", "headers": {}}
        }
        lines += _table("otel", {"exporter": "none", "metrics_exporter": "none", "trace_exporter": exporter})
    # Our `host` server (the control plane's tools) takes the name; a configured server of that name yields.
    servers = [m for m in mcp_servers if host_mcp_url is None or m.name != "host"]
    # Under full_access Codex must not ask about MCP tools either; otherwise each call is a permission request.
    tables, extra_env = mcp_tables(servers, approve=settings.approval_policy == "never")
    lines += tables
    if host_mcp_url is not None:
        # Host tools are answered by the control plane, possibly by a person: allow them time.
        host = {
            "url": host_mcp_url,
            "bearer_token_env_var": HOST_TOKEN_ENV,
            "startup_timeout_sec": 10,
            "tool_timeout_sec": 3600,
            # The control plane answers these calls itself; Codex asking the user first would make
            # every call a second round trip (and without a handler, a rejection).
            "default_tools_approval_mode": "approve",
        }
        lines += _table("mcp_servers.host", host)
    return "\n".join(lines), extra_env
