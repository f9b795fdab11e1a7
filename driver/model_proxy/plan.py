"""How each runtime is pointed at the proxy, and where the proxy forwards (no I/O).

Routes are path prefixes on the one loopback port, each bound to one real upstream:
- `/anthropic` -> the payload's `ANTHROPIC_BASE_URL`, else https://api.anthropic.com (the Claude CLI,
  claude-agent-acp and any Anthropic SDK in the tree append `/v1/messages`);
- `/openai` -> the payload's `OPENAI_BASE_URL`, else https://api.openai.com/v1 (SDKs append
  `/responses`, `/chat/completions`);
- `/codex` -> Codex's `provider_options.base_url` (the Codex adapter writes the proxy's URL into its
  generated config.toml instead).

Routes and upstreams come only from the boot payload (PROTOCOL §9: what the agent can write is input).
An ACP agent's own `CODEX_HOME/config.toml` (codex-acp) is data: the driver copies it with every
`base_url` pointing at the `/openai` route, whose upstream is the payload's; a URL written there never
becomes an upstream.

Each secret is bound to the routes it was configured for (`bindings`): ANTHROPIC_* / CLAUDE_* to
`/anthropic`; Codex's `env_key` to `/codex` (and to `/openai` too when it is OPENAI_API_KEY); every
other secret to `/openai`.

The provider's environment: each secret's variable holds a placeholder instead (fresh per provider
process), `ANTHROPIC_BASE_URL` and `OPENAI_BASE_URL` point at the proxy's routes.
"""

from __future__ import annotations

import re
import secrets as _secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import msgspec

from driver.protocol.boot import ExecutionConfig

ANTHROPIC_VENDOR = "https://api.anthropic.com"
OPENAI_VENDOR = "https://api.openai.com/v1"
PLACEHOLDER_PREFIX = "agent-driver-placeholder-"


class PlanError(ValueError):
    """The payload cannot be served through the proxy (named in the message, values never)."""


@dataclass(frozen=True, slots=True)
class Route:
    name: str  # the path prefix's segment
    upstream: str  # base URL, no trailing slash

    @property
    def family(self) -> str:
        """Whose keys this route takes: `anthropic` for `/anthropic`, `openai` for every other."""
        return "anthropic" if self.name == "anthropic" else "openai"

    @property
    def label(self) -> str:
        """The upstream as `model.usage` names it: scheme, host and path, never credentials or query."""
        parts = urlsplit(self.upstream)
        host = parts.hostname or ""
        if parts.port:
            host = f"{host}:{parts.port}"
        return urlunsplit((parts.scheme, host, parts.path, "", ""))


def family_of(secret_name: str) -> str:
    """Whose key a secret is, by its variable's name: ANTHROPIC_* and CLAUDE_* (the Claude CLI's OAuth
    token) are Anthropic's; any other (OPENAI_API_KEY, CODEX_API_KEY, a custom env_key) goes to the
    OpenAI-compatible routes."""
    upper = secret_name.upper()
    return "anthropic" if "ANTHROPIC" in upper or "CLAUDE" in upper else "openai"


def new_placeholder() -> str:
    """A random value with nothing of the secret in it; recognisable in logs as ours."""
    return PLACEHOLDER_PREFIX + _secrets.token_urlsafe(24)


def _http_url(value: str, where: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PlanError(f"{where} must be an http(s) URL for the model proxy")
    return value.rstrip("/")


def secret_values(execution: ExecutionConfig) -> dict[str, str]:
    """name -> value of each secret the proxy withholds. A name missing from the environment is an error:
    a typo would otherwise leave the real key (under another name) where the agent can read it."""
    proxy = execution.model_proxy
    assert proxy is not None
    missing = [name for name in proxy.secrets if name not in execution.environment]
    if missing:
        raise PlanError(f"execution.model_proxy.secrets names variables not in execution.environment: {missing}")
    return {name: execution.environment[name] for name in proxy.secrets}


def routes(execution: ExecutionConfig) -> dict[str, Route]:
    """The routes of a payload, by name: from the payload alone."""
    env = {**execution.environment, **(execution.acp.env if execution.acp else {})}
    out = {
        "anthropic": Route(
            "anthropic", _http_url(env.get("ANTHROPIC_BASE_URL") or ANTHROPIC_VENDOR, "ANTHROPIC_BASE_URL")
        ),
        "openai": Route("openai", _http_url(env.get("OPENAI_BASE_URL") or OPENAI_VENDOR, "OPENAI_BASE_URL")),
    }
    if execution.runtime == "openai-app-server":
        base = execution.provider_options.get("base_url")
        if base is not None:
            if not isinstance(base, str):
                raise PlanError("provider_options.base_url must be an http(s) URL")
            out["codex"] = Route("codex", _http_url(base, "provider_options.base_url"))
        else:
            out["codex"] = out["openai"]
    return out


CODEX_DEFAULT_ENV_KEY = "OPENAI_API_KEY"


def bindings(execution: ExecutionConfig, secret_names: Sequence[str]) -> dict[str, frozenset[str]]:
    """secret name -> the routes its placeholder is accepted on (and its value sent to)."""
    codex_key: str | None = None
    if execution.runtime == "openai-app-server":
        option = execution.provider_options.get("env_key")
        codex_key = option if isinstance(option, str) and option else CODEX_DEFAULT_ENV_KEY
    out: dict[str, frozenset[str]] = {}
    for name in secret_names:
        if family_of(name) == "anthropic":
            out[name] = frozenset({"anthropic"})
        elif name == codex_key:
            out[name] = frozenset({"codex", "openai"} if name == CODEX_DEFAULT_ENV_KEY else {"codex"})
        else:
            out[name] = frozenset({"openai"})
    return out


def provider_environment(
    env: Mapping[str, str], secrets: Mapping[str, str], placeholders: Mapping[str, str], proxy_url: str
) -> dict[str, str]:
    """`env` (the provider's, built as usual) with each secret replaced by its placeholder and the base
    URLs pointing at the proxy. A secret's value under ANY name is replaced, so a payload that repeats
    the key under a second variable does not leak it that way either."""
    values = {v: placeholders[k] for k, v in secrets.items()}
    out = {}
    for key, value in env.items():
        if key in placeholders:
            out[key] = placeholders[key]
        elif value in values:
            out[key] = values[value]
        else:
            out[key] = value
    out["ANTHROPIC_BASE_URL"] = f"{proxy_url}/anthropic"
    out["OPENAI_BASE_URL"] = f"{proxy_url}/openai"
    return out


def provider_execution(
    execution: ExecutionConfig,
    secrets: Mapping[str, str],
    placeholders: Mapping[str, str],
    proxy_url: str,
    codex_home: str | None = None,
) -> ExecutionConfig:
    """The execution snapshot the adapter gets: Codex's provider `base_url` is the proxy's `/codex`
    route (so its config.toml names the proxy, never the upstream); an ACP agent's own `env` gets the
    same treatment as the environment, and `CODEX_HOME` the rewritten copy."""
    changes: dict[str, object] = {}
    if execution.runtime == "openai-app-server":
        changes["provider_options"] = {**execution.provider_options, "base_url": f"{proxy_url}/codex"}
    if execution.acp is not None:
        acp_env = provider_environment(execution.acp.env, secrets, placeholders, proxy_url)
        # Only what the agent's env named stays in it: the base URLs are in the provider environment.
        acp_env = {k: v for k, v in acp_env.items() if k in execution.acp.env}
        if "ANTHROPIC_BASE_URL" in execution.acp.env:
            acp_env["ANTHROPIC_BASE_URL"] = f"{proxy_url}/anthropic"
        if "OPENAI_BASE_URL" in execution.acp.env:
            acp_env["OPENAI_BASE_URL"] = f"{proxy_url}/openai"
        if codex_home is not None and "CODEX_HOME" in execution.acp.env:
            acp_env["CODEX_HOME"] = codex_home
        changes["acp"] = msgspec.structs.replace(execution.acp, env=acp_env)
    # The snapshot the adapter keeps holds no secret either (adapters log parts of it).
    environment = {k: placeholders.get(k, v) for k, v in execution.environment.items()}
    changes["environment"] = environment
    return msgspec.structs.replace(execution, **changes)


# -- codex-acp: its own CODEX_HOME/config.toml ------------------------------------------------------

_BASE_URL_LINE = re.compile(r'^(?P<lead>\s*base_url\s*=\s*)(?P<q>["\'])(?P<url>[^"\']*)(?P=q)(?P<tail>\s*(#.*)?)$')


def rewrite_codex_config(config_text: str, proxy_route_url: str) -> str:
    """The config with every `base_url = "..."` line pointing at `proxy_route_url` (the `/openai`
    route). The original URLs are dropped: the upstream is the payload's, never the file's. A
    `base_url` Codex would take in another form (an inline table) is not rewritten, so the agent calls
    it with a placeholder, which is worth nothing there."""
    lines = []
    for line in config_text.splitlines():
        match = _BASE_URL_LINE.match(line)
        if match:
            line = f'{match.group("lead")}"{proxy_route_url}"{match.group("tail")}'
        lines.append(line)
    return "\n".join(lines) + "\n"
