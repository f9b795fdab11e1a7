"""The Claude Code CLI's command line and environment for one session (no I/O but finding the binary).

The CLI runs in streaming mode (`--output-format stream-json --input-format stream-json`): prompts go
to its stdin, its messages and control requests come from its stdout (claude_client.py). The flags
are those the Claude Agent SDK (the pinned version, `SDK_VERSION`) builds for the same options;
tests/adapters/test_claude_command.py holds the two side by side, so a new SDK that changes a flag
fails there first.

`provider_options` (PROTOCOL §1: merged into the provider's native options) takes the
`ClaudeAgentOptions` fields that have a command-line form, listed in `OPTION_FLAGS`; `agents` goes in
the initialize request. Any other key is reported as a configuration problem, never silently used:
fields the adapter owns (`RESERVED_OPTIONS`), callbacks (which JSON cannot carry) and fields the CLI
has no flag for.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from driver.adapters.claude.options import (
    RESERVED_OPTIONS,
    bundled_cli,
    mcp_servers,
    mcp_stdio_environment,
    provider_environment,
    system_prompt,
)
from driver.protocol.boot import ExecutionConfig

# The SDK version whose CLI (and command line) this was proven against: the pinned dependency.
SDK_VERSION = "0.2.189"
# Set for the CLI as the SDK sets them: the entrypoint names the SDK, and the host reads session state.
SDK_ENV = {"CLAUDE_CODE_ENTRYPOINT": "sdk-py", "CLAUDE_CODE_SDK_READS_SESSION_STATE": "1"}


def _csv(flag: str) -> Callable[[Any], list[str]]:
    return lambda v: [flag, ",".join(str(x) for x in v)] if isinstance(v, list) and v else []


def _value(flag: str) -> Callable[[Any], list[str]]:
    return lambda v: [flag, str(v)] if v is not None and v != "" else []


def _tools(value: Any) -> list[str]:
    if isinstance(value, list):
        return ["--tools", ",".join(str(x) for x in value)]
    return ["--tools", "default"]  # the `claude_code` preset


def _thinking(value: Any) -> list[str]:
    if not isinstance(value, dict):
        return []
    kind = value.get("type")
    out: list[str] = []
    if kind == "adaptive":
        out = ["--thinking", "adaptive"]
    elif kind == "enabled":
        out = ["--max-thinking-tokens", str(value.get("budget_tokens"))]
    elif kind == "disabled":
        out = ["--thinking", "disabled"]
    if kind != "disabled" and "display" in value:
        out += ["--thinking-display", str(value["display"])]
    return out


def _extra_args(value: Any) -> list[str]:
    out: list[str] = []
    for flag, arg in (value or {}).items():
        out += [f"--{flag}"] if arg is None else [f"--{flag}", str(arg)]
    return out


def _plugins(value: Any) -> list[str]:
    out: list[str] = []
    for plugin in value or []:
        if isinstance(plugin, dict) and plugin.get("type") == "local":
            out += ["--plugin-dir", str(plugin.get("path"))]
    return out


def _json_schema(value: Any) -> list[str]:
    if isinstance(value, dict) and value.get("type") == "json_schema" and value.get("schema") is not None:
        return ["--json-schema", json.dumps(value["schema"])]
    return []


# provider_options key -> its flags. Ordered as the SDK writes them.
OPTION_FLAGS: dict[str, Callable[[Any], list[str]]] = {
    "tools": _tools,
    "allowed_tools": _csv("--allowedTools"),
    "max_turns": lambda v: ["--max-turns", str(v)] if v else [],
    "max_budget_usd": _value("--max-budget-usd"),
    "disallowed_tools": _csv("--disallowedTools"),
    "fallback_model": _value("--fallback-model"),
    "betas": _csv("--betas"),
    "settings": _value("--settings"),
    "plugins": _plugins,
    "extra_args": _extra_args,
    "thinking": _thinking,
    "max_thinking_tokens": _value("--max-thinking-tokens"),
    "effort": _value("--effort"),
    "output_format": _json_schema,
}
# Keys that are read elsewhere: the binary, the model, extra directories, the initialize request.
OTHER_OPTIONS = frozenset({"cli_path", "model", "add_dirs", "agents", "system_prompt", "setting_sources"})


@dataclass(frozen=True, slots=True)
class Launch:
    """What starting one CLI takes: its argv, its whole environment, what the initialize request adds,
    and the configuration problems to report (names, never values)."""

    argv: list[str]
    env: dict[str, str]
    initialize: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Session:
    """Which native session the CLI opens: `resume` an existing one, or start `session_id` fresh."""

    resume: str | None = None
    session_id: str | None = None


def build(
    execution: ExecutionConfig,
    *,
    base_env: Mapping[str, str],
    state_dir: Path,
    cwd: str,
    add_dirs: list[str],
    driver_text: str,
    session: Session,
    setting_sources: list[str],
    extra_servers: Mapping[str, dict[str, Any]] | None = None,
    extra_env: Mapping[str, str] | None = None,
) -> Launch:
    """The CLI's launch for `execution`; `extra_servers` are the driver's own MCP servers (the `host`
    server of §6.3) and `extra_env` what they need (the host server's token)."""
    env = provider_environment(base_env, state_dir)
    env.update(mcp_stdio_environment(execution.mcp_servers))
    env.update(extra_env or {})
    env.update(SDK_ENV)
    env["CLAUDE_AGENT_SDK_VERSION"] = SDK_VERSION
    env["PWD"] = cwd
    servers, problems = mcp_servers(execution.mcp_servers, execution.environment)
    servers = {**servers, **(extra_servers or {})}
    options = dict(execution.provider_options)
    for key in list(options):
        if key in RESERVED_OPTIONS or (key not in OPTION_FLAGS and key not in OTHER_OPTIONS):
            problems.append(f"provider_options.{key} is not a usable option for the Claude Code CLI")
            del options[key]
    cli = options.get("cli_path") or bundled_cli()
    if cli is None:
        problems.append("the Claude Code CLI was found neither in claude-agent-sdk nor on PATH")
    prompt = options["system_prompt"] if "system_prompt" in options else system_prompt(execution, driver_text)
    argv = [str(cli or "claude"), "--output-format", "stream-json", "--verbose"]
    argv += _system_prompt_flags(prompt)
    for key, flags in OPTION_FLAGS.items():
        if key in ("tools", "allowed_tools", "max_turns", "max_budget_usd", "disallowed_tools") and key in options:
            argv += flags(options[key])
    model = options.get("model") or execution.model
    if model:
        argv += ["--model", str(model)]
    for key in ("fallback_model", "betas"):
        if key in options:
            argv += OPTION_FLAGS[key](options[key])
    if execution.permission_policy == "full_access":
        argv += ["--permission-mode", "bypassPermissions"]
    else:
        # Every prompt comes to the driver as a control request (`can_use_tool`), as the SDK routes it.
        argv += ["--permission-prompt-tool", "stdio", "--permission-mode", "default"]
    if session.resume is not None:
        argv.append(f"--resume={session.resume}")
    if session.session_id is not None:
        argv.append(f"--session-id={session.session_id}")
    if "settings" in options:
        argv += OPTION_FLAGS["settings"](options["settings"])
    for directory in [*add_dirs, *(options.get("add_dirs") or [])]:
        argv += ["--add-dir", str(directory)]
    if servers:
        argv += ["--mcp-config", json.dumps({"mcpServers": servers})]
    argv.append("--include-partial-messages")
    sources = options.get("setting_sources", setting_sources)
    argv.append(f"--setting-sources={','.join(str(s) for s in sources)}")
    for key in ("plugins", "extra_args", "thinking", "max_thinking_tokens", "effort", "output_format"):
        if key in options and not (key == "max_thinking_tokens" and "thinking" in options):
            argv += OPTION_FLAGS[key](options[key])
    argv += ["--input-format", "stream-json"]
    initialize = {"agents": options["agents"]} if options.get("agents") else {}
    return Launch(argv, env, initialize, problems)


def _system_prompt_flags(prompt: Any) -> list[str]:
    if prompt is None:
        return ["--system-prompt", ""]
    if isinstance(prompt, str):
        return ["--system-prompt", prompt]
    if isinstance(prompt, dict):
        if prompt.get("type") == "file":
            return ["--system-prompt-file", str(prompt.get("path"))]
        if prompt.get("type") == "custom":
            return ["--system-prompt", str(prompt.get("prompt"))]
        if prompt.get("type") == "preset" and "append" in prompt:
            return ["--append-system-prompt", str(prompt["append"])]
    return []
