"""Building the Claude Agent SDK's options for one CLI process: environment, MCP servers (the
execution's and the in-process `host` server of PROTOCOL §6.3), skills the native way (§6.4),
instructions, the permission mode, `provider_options`, and the launcher that contains the CLI.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import claude_agent_sdk as sdk

from driver.adapters import instructions
from driver.adapters.base import AdapterConfig, HostToolPort
from driver.adapters.claude_options import (
    RESERVED_OPTIONS,
    bundled_cli,
    launch_command,
    mcp_servers,
    mcp_stdio_environment,
    provider_environment,
    system_prompt,
)


def sdk_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The SDK keeps a dict schema as JSON Schema only when it has `properties`; any other dict is read
    as a {name: type} map (so `{"type": "object"}` became "a string parameter named type")."""
    if schema.get("type") == "object" and "properties" not in schema:
        return {**schema, "properties": {}}
    return schema


def host_server(config: AdapterConfig, port: HostToolPort) -> Any:
    """PROTOCOL §6.3: the execution's host tools as one in-process MCP server named `host`; each
    call goes through the host-tool port (which reports `host_tool.called` and awaits the CP)."""
    tools = config.execution.host_tools
    if not tools:
        return None

    def handler(name: str) -> Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]:
        async def call(arguments: dict[str, Any]) -> dict[str, Any]:
            reply = await port.call(name, arguments)
            return {"content": reply.content, "is_error": reply.is_error}

        return call

    definitions = [
        sdk.SdkMcpTool(
            name=t.name, description=t.description, input_schema=sdk_schema(t.input_schema), handler=handler(t.name)
        )
        for t in tools
    ]
    return sdk.create_sdk_mcp_server("host", tools=definitions)


def client_options(
    config: AdapterConfig,
    host_tools: HostToolPort,
    *,
    resume: str | None,
    session_id: str | None,
    on_stderr: Callable[[str], None],
    can_use_tool: Callable[..., Awaitable[Any]],
) -> tuple[Any, list[str], bool]:
    """(`ClaudeAgentOptions`, configuration problems to report, whether the containing launcher is used)."""
    execution = config.execution
    env = provider_environment(config.env, config.state_dir)
    env.update(mcp_stdio_environment(execution.mcp_servers))
    servers, problems = mcp_servers(execution.mcp_servers, execution.environment)
    # Skills (PROTOCOL §6.4) the native way: linked into the user skills folder of our own
    # CLAUDE_CONFIG_DIR, with the "user" settings source on so Claude Code lists them. That
    # source reads only files under the driver's state_dir; the project's settings stay off.
    skills = instructions.installed_skills(Path(config.session.cwd), execution.skills)
    if skills:
        instructions.link_skills(skills, Path(env["CLAUDE_CONFIG_DIR"]) / "skills")
    driver_text = instructions.compose(execution, config.session, own_prompt=False)
    if skills:
        # Claude Code lists skills by name and description only; the model also learns where they are.
        driver_text += "\n\n" + instructions.skill_paths_paragraph(skills)
    kwargs: dict[str, Any] = {
        "cwd": config.session.cwd,
        "system_prompt": system_prompt(execution, driver_text),
        "include_partial_messages": True,
        "setting_sources": ["user"] if skills else [],
        "env": env,
        "stderr": on_stderr,
        "mcp_servers": servers,
        "add_dirs": [d for d in [config.session.memory_dir, *config.session.additional_directories] if d],
    }
    if execution.model:
        kwargs["model"] = execution.model
    if execution.permission_policy == "full_access":
        kwargs["permission_mode"] = "bypassPermissions"
    else:
        kwargs["permission_mode"] = "default"
        kwargs["can_use_tool"] = can_use_tool
    host = host_server(config, host_tools)
    if host is not None:
        kwargs["mcp_servers"] = {**servers, "host": host}
    if resume is not None:
        kwargs["resume"] = resume
    if session_id is not None:
        kwargs["session_id"] = session_id
    fields = {f.name for f in dataclasses.fields(sdk.ClaudeAgentOptions)}
    for key, value in execution.provider_options.items():
        if key in fields and key not in RESERVED_OPTIONS:
            kwargs[key] = value
        else:
            problems.append(f"provider_options.{key} is not a usable ClaudeAgentOptions field")
    cli = kwargs.pop("cli_path", None) or bundled_cli()  # provider_options may name another CLI
    driver_dir = Path(config.session.state_dir) / "driver"
    launch = launch_command(cli, env.keys(), os.environ, driver_dir) if cli else None
    if launch is not None:
        launcher, launch_env = launch
        kwargs["cli_path"] = str(launcher)
        env.update(launch_env)  # read by the launcher, dropped before the CLI starts
    elif cli is not None:
        kwargs["cli_path"] = str(cli)
    return sdk.ClaudeAgentOptions(**kwargs), problems, launch is not None
