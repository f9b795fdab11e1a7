"""How an ACP session is set up from the execution snapshot: pure functions, no I/O.

`session/new` and `session/load` parameters (cwd, MCP servers in ACP's shapes, extra directories,
system prompt), which session mode a permission policy wants, which model selector value to set and
which environment-variable auth method can be used. The adapter sends what these decide.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from driver.adapters.acp import models as m
from driver.adapters.common import attachments, instructions
from driver.ports.mcp_host import SERVER_NAME as HOST_SERVER_NAME
from driver.protocol.boot import ExecutionConfig, SessionConfig
from driver.protocol.commands import Attachment

# Mode ids of the agents we know, by policy. ACP has no standard "never ask" switch.
FULL_ACCESS_MODES: tuple[str, ...] = ("bypassPermissions", "full-access", "yolo")
# Claude's agent defaults to `auto`, which decides by itself without asking: `default` asks.
SUPERVISED_MODES: tuple[str, ...] = ("default",)


@dataclass(frozen=True, slots=True)
class HostServer:
    """The loopback MCP server offering execution.host_tools (see driver/ports/mcp_host.py)."""

    url: str
    token: str


def mcp_servers(
    execution: ExecutionConfig, agent: m.InitializeResult, host: HostServer | None, warnings: list[str]
) -> list[dict[str, Any]]:
    """PROTOCOL §6.3 entries in ACP's shapes; header values come from execution.environment (they
    travel only over the agent's stdin, never to disk). What cannot be passed is added to `warnings`."""
    http_ok = agent.agent_capabilities.mcp_capabilities.http
    servers: list[dict[str, Any]] = []
    if host is not None and http_ok:
        auth = {"name": "Authorization", "value": f"Bearer {host.token}"}
        servers.append({"type": "http", "name": HOST_SERVER_NAME, "url": host.url, "headers": [auth]})
    for server in execution.mcp_servers:
        if host is not None and server.name == HOST_SERVER_NAME:
            warnings.append(f"mcp server {server.name!r}: the name is reserved for host_tools; skipped")
            continue
        if server.transport == "stdio":
            servers.append(
                {
                    "name": server.name,
                    "command": server.command[0] if server.command else "",
                    "args": server.command[1:],
                    "env": [{"name": k, "value": v} for k, v in server.env.items()],
                }
            )
            continue
        if not http_ok:
            warnings.append(f"mcp server {server.name!r}: the acp agent takes no MCP server over http; skipped")
            continue
        headers = []
        for header, var in server.headers_from_env.items():
            if var in execution.environment:
                headers.append({"name": header, "value": execution.environment[var]})
            else:
                warnings.append(f"mcp server {server.name!r}: header {header} needs {var} in execution.environment")
        servers.append({"type": "http", "name": server.name, "url": server.url or "", "headers": headers})
    return servers


def session_params(
    cwd: Path,
    session: SessionConfig,
    execution: ExecutionConfig,
    agent: m.InitializeResult,
    host: HostServer | None,
    warnings: list[str],
) -> dict[str, Any]:
    params: dict[str, Any] = {"cwd": str(cwd), "mcpServers": mcp_servers(execution, agent, host, warnings)}
    capabilities = agent.agent_capabilities.session_capabilities
    extra = list(session.additional_directories)
    if session.memory_dir:
        extra.append(session.memory_dir)
    if extra and capabilities.additional_directories is not None:
        params["additionalDirectories"] = extra
    text = instruction_text(cwd, session, execution)
    if text and capabilities.system_prompt is not None:
        # `append` keeps the agent's own instructions (tool use, safety); every agent that
        # advertises the capability supports it.
        params["systemPrompt"] = {"mode": "append", "content": [{"type": "text", "text": text}]}
    return params


def instruction_text(cwd: Path, session: SessionConfig, execution: ExecutionConfig) -> str:
    """The system prompt, the driver's paragraph and the skills (ACP has no skills mechanism, so they
    are listed with their paths): sent as the session's system prompt where the agent takes one, else
    ahead of the first prompt of each new session."""
    return instructions.compose(execution, session, instructions.installed_skills(cwd, execution.skills))


def wanted_mode(execution: ExecutionConfig, modes: m.SessionModeState | None) -> str | None:
    """The session mode to switch to, or None to keep the current one."""
    if modes is None:
        return None
    wanted = execution.provider_options.get("mode")
    if not isinstance(wanted, str):
        preferred = FULL_ACCESS_MODES if execution.permission_policy == "full_access" else SUPERVISED_MODES
        available = [mode.id for mode in modes.available_modes]
        wanted = next((mode for mode in preferred if mode in available), None)
    return wanted if wanted and wanted != modes.current_mode_id else None


def model_choice(model: str, config_options: list[m.ConfigOption]) -> tuple[str, str] | None:
    """(config id, value) that selects `model`, when the agent offers it in a "model" selector.

    ACP has no standard model field; otherwise the agent's default (or its own configuration, e.g.
    CODEX_HOME's config.toml) stays."""
    selector = next((o for o in config_options if o.category == "model" or o.id == "model"), None)
    if not model or selector is None or selector.current_value == model or model not in selector.values():
        return None
    return selector.id, model


def env_auth_method(agent: m.InitializeResult, env: Mapping[str, str]) -> m.AuthMethod | None:
    """The first `env_var` auth method whose variables are all set."""
    for method in agent.auth_methods:
        if method.type == "env_var" and method.vars and all(env.get(v.name) for v in method.vars):
            return method
    return None


def auth_hint(agent: m.InitializeResult) -> str:
    names = sorted({v.name for a in agent.auth_methods if a.type == "env_var" for v in a.vars})
    if names:
        return f"set one of {', '.join(names)} in execution.environment"
    methods = ", ".join(a.id for a in agent.auth_methods) or "none"
    return f"it offers no environment-variable method (methods: {methods})"


def attachment_blocks(cwd: Path, given: Sequence[Attachment], agent: m.InitializeResult) -> list[dict[str, Any]]:
    """The attachments (downloaded into cwd/inputs/ by the kernel) as ACP content blocks: images as
    `image` where the agent takes them, short texts as embedded `resource` where it takes embedded
    context, anything else as a `resource_link` (every agent accepts those). An image for an agent
    without image support is refused (AttachmentRefused): it would silently never reach the model."""
    caps = agent.agent_capabilities.prompt_capabilities
    blocks: list[dict[str, Any]] = []
    for item in attachments.local(cwd, given):
        uri = item.path.as_uri()
        if item.kind == "image":
            if not caps.image:
                raise attachments.AttachmentRefused(
                    f"attachment {item.name!r}: the acp agent does not accept images (promptCapabilities.image)"
                )
            blocks.append({"type": "image", "mimeType": item.mime_type, "data": item.base64(), "uri": uri})
        elif item.kind == "text" and caps.embedded_context:
            resource = {"uri": uri, "mimeType": item.mime_type, "text": item.text()}
            blocks.append({"type": "resource", "resource": resource})
        else:
            blocks.append({"type": "resource_link", "name": item.name, "uri": uri})
    return blocks
