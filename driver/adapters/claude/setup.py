"""What one Claude Code CLI is started with, from the execution snapshot: skills the native way (§6.4),
the driver's instructions, the `host` MCP server of §6.3 (the driver's loopback server, as Codex and
ACP agents get it), and the command line (claude_command.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from driver.adapters.claude.command import Launch, Session, build
from driver.adapters.common import instructions
from driver.adapters.common.base import AdapterConfig
from driver.adapters.common.host_server import HOST_TOKEN_ENV
from driver.ports.mcp_host import McpHostServer

# Host tools wait for the control plane (possibly a person): the CLI's MCP call must outwait the
# driver's own bound (`host_tool_timeout_ms`), which ends the call with an error result first.
HOST_CALL_MARGIN_MS = 60_000


def host_entry(host: McpHostServer) -> dict[str, Any]:
    """The `host` server in the CLI's `--mcp-config`: the token by reference (`${VAR}`), never its value
    on the command line, where every process can read it in /proc/<pid>/cmdline."""
    return {"type": "http", "url": host.url, "headers": {"Authorization": "Bearer ${" + HOST_TOKEN_ENV + "}"}}


def launch(config: AdapterConfig, host: McpHostServer | None, session: Session) -> Launch:
    execution = config.execution
    state_dir = config.state_dir
    cwd = config.session.cwd
    # Skills (PROTOCOL §6.4) the native way: linked into the user skills folder of our own
    # CLAUDE_CONFIG_DIR, with the "user" settings source on so Claude Code lists them. That
    # source reads only files under the driver's state_dir; the project's settings stay off.
    skills = instructions.installed_skills(Path(cwd), execution.skills)
    config_dir = Path(config.env.get("CLAUDE_CONFIG_DIR") or state_dir / "claude-config")
    if skills:
        # Walked from state_dir when the config folder is ours (the agent may have made it a file).
        inside = config_dir.is_relative_to(state_dir)
        instructions.link_skills(skills, config_dir / "skills", state_dir if inside else None)
    driver_text = instructions.compose(execution, config.session, own_prompt=False)
    if skills:
        # Claude Code lists skills by name and description only; the model also learns where they are.
        driver_text += "\n\n" + instructions.skill_paths_paragraph(skills)
    extra_env: dict[str, str] = {}
    servers: dict[str, dict[str, Any]] = {}
    if host is not None:
        servers["host"] = host_entry(host)
        extra_env[HOST_TOKEN_ENV] = host.token
        extra_env["MCP_TOOL_TIMEOUT"] = str(execution.host_tool_timeout_ms + HOST_CALL_MARGIN_MS)
    add_dirs = [d for d in [config.session.memory_dir, *config.session.additional_directories] if d]
    return build(
        execution,
        base_env=config.env,
        state_dir=state_dir,
        cwd=cwd,
        add_dirs=add_dirs,
        driver_text=driver_text,
        session=session,
        setting_sources=["user"] if skills else [],
        extra_servers=servers,
        extra_env=extra_env,
    )
