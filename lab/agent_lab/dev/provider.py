"""The provider of `agent-driver dev`: the real API when its key is set, else the offline fake model endpoint."""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent_lab.dev.common import OFFLINE_MARKERS, DevError, DevPaths
from agent_lab.testing import codex_acp


@dataclass
class ProviderSetup:
    notice: str  # the first line of output: which model endpoint answers
    environment: dict[str, str]  # execution.environment: given to the provider process only
    model: str = ""
    provider_options: dict[str, Any] = field(default_factory=dict)
    acp: dict[str, Any] | None = None


def _offline_notice(key_name: str, api: str, base_url: str) -> str:
    return (
        f"OFFLINE: {key_name} is not set, so replies come from the fake {api} endpoint at {base_url} "
        f"({OFFLINE_MARKERS})."
    )


def prepare_provider(
    runtime: str, paths: DevPaths, env: Mapping[str, str], stack: contextlib.ExitStack
) -> ProviderSetup:
    """Configure the runtime; a fake endpoint it starts is closed by `stack`."""
    if runtime == "claude-agent-sdk":
        return _claude(env, stack)
    if runtime == "openai-app-server":
        return _codex(env, stack)
    if runtime == "acp":
        return _codex_acp(paths, env, stack)
    raise DevError(f"unknown runtime {runtime!r}")


def _claude(env: Mapping[str, str], stack: contextlib.ExitStack) -> ProviderSetup:
    key = env.get("ANTHROPIC_API_KEY")
    if key:
        environment = {"ANTHROPIC_API_KEY": key}
        notice = "Using the real Anthropic API (ANTHROPIC_API_KEY is set)."
        if env.get("ANTHROPIC_BASE_URL"):
            environment["ANTHROPIC_BASE_URL"] = env["ANTHROPIC_BASE_URL"]
            notice = f"Using the Anthropic API at {env['ANTHROPIC_BASE_URL']} (ANTHROPIC_API_KEY is set)."
        return ProviderSetup(notice, environment)
    from agent_lab.testing.fake_anthropic import FakeAnthropic

    fake = stack.enter_context(FakeAnthropic())
    # The adapter adds the switches that keep the CLI on this one endpoint (see claude_options).
    return ProviderSetup(
        _offline_notice("ANTHROPIC_API_KEY", "Anthropic Messages", fake.base_url),
        {"ANTHROPIC_BASE_URL": fake.base_url, "ANTHROPIC_API_KEY": "sk-ant-dev-offline-key"},
        model="claude-sonnet-4-5",
    )


def _openai_endpoint(env: Mapping[str, str], stack: contextlib.ExitStack) -> tuple[str, str | None, str]:
    """(notice, base URL or None for the provider's default, API key)."""
    key = env.get("OPENAI_API_KEY")
    if key:
        base_url = env.get("OPENAI_BASE_URL")
        where = f"the OpenAI API at {base_url}" if base_url else "the real OpenAI API"
        return f"Using {where} (OPENAI_API_KEY is set).", base_url, key
    from agent_lab.testing.fake_responses import FakeResponses

    fake = stack.enter_context(FakeResponses())
    notice = _offline_notice("OPENAI_API_KEY", "OpenAI Responses", fake.base_url)
    return notice, fake.base_url, "sk-dev-offline-key"


def _codex(env: Mapping[str, str], stack: contextlib.ExitStack) -> ProviderSetup:
    if importlib.util.find_spec("driver.adapters.codex") is None:
        raise DevError("the openai-app-server adapter is not part of this build yet; try --runtime claude-agent-sdk")
    notice, base_url, key = _openai_endpoint(env, stack)
    options: dict[str, Any] = {"env_key": "OPENAI_API_KEY"}
    if base_url:
        options["base_url"] = base_url
    return ProviderSetup(notice, {"OPENAI_API_KEY": key}, provider_options=options)


def codex_acp_binary() -> Path:
    from driver.kernel.options import project_root

    found = codex_acp.binary(project_root())
    if found is None:
        raise DevError(f"codex-acp is not installed under {project_root() / 'node_modules'}; run `make setup`")
    return found


def _codex_acp(paths: DevPaths, env: Mapping[str, str], stack: contextlib.ExitStack) -> ProviderSetup:
    """The `acp` runtime with codex-acp as the agent, configured through its own CODEX_HOME."""
    binary = codex_acp_binary()
    notice, base_url, key = _openai_endpoint(env, stack)
    home = paths.session_dir / "codex-home"
    tmp = paths.session_dir / "tmp"  # codex-acp will not install its sandbox helper under /tmp
    tmp.mkdir(mode=0o700, exist_ok=True)
    offline = not env.get("OPENAI_API_KEY")
    codex_acp.write_home(
        home, base_url or "https://api.openai.com/v1", model=codex_acp.OFFLINE_MODEL if offline else None
    )
    acp = {"command": [str(binary)], "env": {"CODEX_HOME": str(home), "TMPDIR": str(tmp)}}
    return ProviderSetup(notice, {"OPENAI_API_KEY": key}, acp=acp)
