"""codex-acp, configured to run offline against a Responses endpoint (the fake, or a real one).

codex-acp reads its own `CODEX_HOME/config.toml` (the driver's `acp` runtime passes no model settings
to an ACP agent), so `make run`, the tests and the benchmarks all write this one file.
"""

from __future__ import annotations

from pathlib import Path

# Measured on codex-acp 0.16.0: an unknown model makes it put "Model metadata … not found" into the
# reply; with unified exec it reports no tool call at all for a shell command.
CONFIG_TEMPLATE = """\
{model_line}model_provider = "driver"
check_for_update_on_startup = false

[model_providers.driver]
name = "driver"
base_url = "{base_url}"
wire_api = "responses"
env_key = "{env_key}"
requires_openai_auth = false
request_max_retries = 0
stream_max_retries = 0

[features]
plugins = false
unbounded_connection_retries = false
shell_snapshot = false
unified_exec = false

[analytics]
enabled = false
"""


OFFLINE_MODEL = "gpt-5.4"


def config_toml(base_url: str, env_key: str = "OPENAI_API_KEY", model: str | None = OFFLINE_MODEL) -> str:
    """`model=None` leaves the choice to codex-acp (a real endpoint knows its models)."""
    model_line = f'model = "{model}"\n' if model else ""
    return CONFIG_TEMPLATE.format(model_line=model_line, base_url=base_url, env_key=env_key)


def write_home(home: Path, base_url: str, env_key: str = "OPENAI_API_KEY", model: str | None = OFFLINE_MODEL) -> Path:
    """Create `home` (a CODEX_HOME) with the config; return it."""
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    (home / "config.toml").write_text(config_toml(base_url, env_key, model))
    return home


def binary(project_root: Path) -> Path | None:
    """The platform binary of the pinned codex-acp under `project_root/node_modules`, if installed."""
    modules = project_root / "node_modules"
    for candidate in (
        modules / "@zed-industries" / "codex-acp-linux-x64" / "bin" / "codex-acp",
        modules / ".bin" / "codex-acp",
    ):
        if candidate.exists():
            return candidate
    return None
