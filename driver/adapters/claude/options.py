"""How the Claude Code CLI is configured from an execution snapshot: environment, MCP servers,
system prompt, where the CLI is, and the recovery preamble. Plain functions with no SDK import, so
they are testable without starting anything.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from driver.protocol.boot import ExecutionConfig, McpServer, RecoveryMessage

RUNTIME = "claude-agent-sdk"

# Options the adapter owns: the permission policy, the session and the plumbing must not be
# overridden by provider_options, or `full_access` / `supervised` would stop meaning what they say.
# (`cli_path` is not reserved: another CLI still runs through the launcher.)
RESERVED_OPTIONS: frozenset[str] = frozenset(
    {
        "permission_mode",
        "can_use_tool",
        "cwd",
        "env",
        "resume",
        "session_id",
        "stderr",
        "include_partial_messages",
        "continue_conversation",
        "fork_session",
    }
)


def provider_environment(base: Mapping[str, str], state_dir: Path) -> dict[str, str]:
    """The CLI's environment: the kernel's filtered base plus the switches that keep it offline and
    its state under `state_dir`. Values already in `base` (i.e. chosen by the execution) win."""
    env = dict(base)
    env.setdefault("HOME", str(state_dir / "home"))
    # Config, sessions (needed for resume) and caches live with the session, not in a shared home.
    env.setdefault("CLAUDE_CONFIG_DIR", str(state_dir / "claude-config"))
    # Stops telemetry, update checks, feedback surveys: the CLI then only calls /v1/messages.
    env.setdefault("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
    env.setdefault("DISABLE_AUTOUPDATER", "1")
    # One quick retry for a transient 5xx; more would hide a broken endpoint behind long backoffs.
    env.setdefault("CLAUDE_CODE_MAX_RETRIES", "1")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        # As root the CLI refuses bypassPermissions unless it is told it runs in a sandbox.
        env.setdefault("IS_SANDBOX", "1")
    return env


def mcp_servers(
    servers: Iterable[McpServer], environment: Mapping[str, str]
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """PROTOCOL §6.3 entries in the SDK's native form. Returns the servers and the problems found
    (names of missing variables, never their values).

    A header's value is written as `${VAR}`, never as the value: the SDK hands these entries to the
    CLI as `--mcp-config` JSON on its command line, which every process can read in
    /proc/<pid>/cmdline. The CLI expands `${VAR}` from its own environment, where `VAR` already is
    (`execution.environment` is the provider's environment), so the value stays out of argv and off
    disk."""
    native: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    for server in servers:
        if server.transport == "http":
            headers: dict[str, str] = {}
            for header, var in server.headers_from_env.items():
                if var in environment:
                    headers[header] = "${" + var + "}"
                else:
                    problems.append(f"mcp server {server.name!r}: header {header} needs ${var}, which is not set")
            entry: dict[str, Any] = {"type": "http", "url": server.url or ""}
            if headers:
                entry["headers"] = headers
            native[server.name] = entry
        else:
            if not server.command:
                problems.append(f"mcp server {server.name!r}: stdio transport without a command")
                continue
            native[server.name] = {
                "type": "stdio",
                "command": server.command[0],
                "args": list(server.command[1:]),
                # References, not values (see above); `mcp_stdio_environment` puts the values in the
                # CLI's environment and the CLI expands them when it starts the server.
                "env": {key: "${" + var + "}" for key, var in _stdio_vars(server).items()},
            }
    return native, problems


def mcp_stdio_environment(servers: Iterable[McpServer]) -> dict[str, str]:
    """The variables the `${VAR}` references of stdio servers' `env` name, with their values."""
    out: dict[str, str] = {}
    for server in servers:
        if server.transport == "stdio":
            for key, var in _stdio_vars(server).items():
                out[var] = server.env[key]
    return out


def _stdio_vars(server: McpServer) -> dict[str, str]:
    """key -> a variable name unique to this server and key (hex of both: any byte is safe)."""
    return {key: f"AGENT_MCP_ENV_{server.name.encode().hex()}_{key.encode().hex()}" for key in server.env}


def system_prompt(execution: ExecutionConfig, driver_text: str = "") -> str | dict[str, str]:
    """An empty prompt means "the provider's own": Claude Code's preset, which teaches the model its
    tools, with the driver's paragraph appended. A non-empty one replaces it, as the execution
    snapshot asks, and the driver's paragraph follows it."""
    if execution.system_prompt:
        return "\n\n".join(p for p in (execution.system_prompt, driver_text) if p)
    preset: dict[str, str] = {"type": "preset", "preset": "claude_code"}
    if driver_text:
        preset["append"] = driver_text
    return preset


def bundled_cli() -> Path | None:
    """The Claude Code binary shipped inside the SDK wheel, else one on PATH."""
    import importlib.util

    spec = importlib.util.find_spec("claude_agent_sdk")
    if spec is not None and spec.origin:
        candidate = Path(spec.origin).parent / "_bundled" / "claude"
        if candidate.is_file():
            return candidate
    found = shutil.which("claude")
    return Path(found) if found else None


def recovery_preamble(messages: Iterable[RecoveryMessage]) -> str:
    """Context prepended to the first prompt after a failed resume, so the model still knows what
    was said before (PROTOCOL §7)."""
    lines = [f"[{m.role}]: {m.text}" for m in messages]
    if not lines:
        return ""
    return (
        "<previous_conversation>\n"
        "The earlier conversation of this session could not be restored; here it is for context.\n"
        + "\n".join(lines)
        + "\n</previous_conversation>\n\n"
    )
