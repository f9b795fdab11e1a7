"""Codex's files: the pinned platform binary inside node_modules, the generated CODEX_HOME (config.toml
and skills), the helper aliases Codex dispatches on, and file digests for `file.changed`.

CODEX_HOME and the helper folder sit under `state_dir/providers/`, which the agent can write (PROTOCOL
§9): a link it plants there (at `codex-home/config.toml`, at `codex-home` itself) is never written
through. Every write goes through driver.agent_files, walked from the boot payload's `state_dir`; a
file or link where a folder should be is set aside (kept under a fresh name) and the folder made.
"""

from __future__ import annotations

import contextlib
import os
import platform
from pathlib import Path

from driver import agent_files, logs
from driver.adapters.codex.config import CodexConfigError, CodexSettings, render_config, settings_from
from driver.adapters.common import instructions
from driver.adapters.common.base import AdapterConfig, ProviderError

# npm package suffix and Rust target triple of the platform binary, by machine.
_PLATFORMS = {
    "x86_64": ("linux-x64", "x86_64-unknown-linux-musl"),
    "amd64": ("linux-x64", "x86_64-unknown-linux-musl"),
    "aarch64": ("linux-arm64", "aarch64-unknown-linux-musl"),
    "arm64": ("linux-arm64", "aarch64-unknown-linux-musl"),
}
_HELPER_NAMES = ("codex-linux-sandbox",)

log = logs.get("driver.adapters.codex_files")


def _anchored(config: AdapterConfig, name: str) -> tuple[Path, Path]:
    """(trusted root, path below it) of the provider folder's `name`: the root is the boot payload's
    `state_dir` when the provider folder is under it (the driver's layout), else the folder itself."""
    root = Path(config.session.state_dir)
    try:
        return root, config.state_dir.relative_to(root) / name
    except ValueError:
        return config.state_dir, Path(name)


def _folder(root: Path, relative: Path) -> Path:
    """`root/relative` as a folder made without following a link; what stands there otherwise (a file,
    a link the agent planted) is set aside first."""
    root.mkdir(parents=True, exist_ok=True, mode=0o700)  # the trusted root itself (the driver's layout)
    try:
        return agent_files.make_folder(root, relative)
    except agent_files.AgentFileError:
        if not os.path.lexists(root / relative):
            raise
        aside = agent_files.set_aside(root / relative)
        log.warning("codex.folder_set_aside", path=str(relative), set_aside_as=aside.name)
        return agent_files.make_folder(root, relative)


def codex_binary(project_root: Path, machine: str | None = None) -> Path:
    """The platform Codex binary inside node_modules; ProviderError("provider.missing") if absent."""
    machine = (machine or platform.machine()).lower()
    if machine not in _PLATFORMS:
        raise ProviderError("provider.missing", f"codex: no binary for machine type {machine!r}")
    package, triple = _PLATFORMS[machine]
    path = project_root / "node_modules" / "@openai" / f"codex-{package}" / "vendor" / triple / "bin" / "codex"
    if not path.is_file() or not os.access(path, os.X_OK):
        raise ProviderError(
            "provider.missing",
            f"codex binary not found at {path} (install the pinned @openai/codex with `npm install`)",
        )
    return path


def prepare_home(config: AdapterConfig, host_mcp_url: str | None) -> tuple[Path, dict[str, str], CodexSettings]:
    """Write CODEX_HOME under the provider's state_dir; return it, the extra environment the config
    needs, and the settings it was rendered from."""
    execution = config.execution
    try:
        settings = settings_from(execution)
        text, extra_env = render_config(
            settings,
            execution.mcp_servers,
            host_mcp_url,
            # Set by the kernel when the boot payload names a collector (driver.telemetry.room).
            otlp_endpoint=config.env.get("OTEL_EXPORTER_OTLP_ENDPOINT"),
        )
    except CodexConfigError as exc:
        raise ProviderError("provider.config", str(exc)) from None
    if settings.base_url is not None and settings.env_key not in config.env:
        raise ProviderError(
            "provider.config", f"codex: the API key variable {settings.env_key} is not in execution.environment"
        )
    root, relative = _anchored(config, "codex-home")
    try:
        home = _folder(root, relative)
        agent_files.write_file(root, relative / "config.toml", text.encode())
    except agent_files.AgentFileError as exc:
        raise ProviderError("provider.start_failed", f"codex: CODEX_HOME: {exc}", retryable=True) from None
    # Skills (PROTOCOL §6.4) the native way: Codex lists what CODEX_HOME/skills holds to the model.
    skills = instructions.installed_skills(Path(config.session.cwd), execution.skills)
    if skills:
        instructions.link_skills(skills, root / relative / "skills", root)
    return home, extra_env, settings


def helper_aliases(state_dir: Path, binary: Path) -> Path:
    """A folder of links to the binary under the helper names Codex dispatches on argv[0]
    (`codex-linux-sandbox` runs commands inside the sandbox). Codex makes these itself under
    CODEX_HOME, but refuses when CODEX_HOME is under the temporary directory, and then every
    sandboxed command fails with "execvp codex-linux-sandbox: No such file"."""
    folder = state_dir / "codex-bin"
    try:
        fd = agent_files.open_folder(state_dir, "codex-bin", create=True)
    except agent_files.AgentFileError:
        log.warning("codex.folder_set_aside", path="codex-bin", set_aside_as=agent_files.set_aside(folder).name)
        fd = agent_files.open_folder(state_dir, "codex-bin", create=True)
    try:
        # Relative to the folder's descriptor (the agent's, PROTOCOL §9): nothing here follows a link.
        for name in _HELPER_NAMES:
            with contextlib.suppress(OSError):
                if os.readlink(name, dir_fd=fd) == str(binary):
                    continue
            try:
                os.unlink(name, dir_fd=fd)
            except FileNotFoundError:
                pass
            except IsADirectoryError:  # the agent's folder under that name: kept, renamed
                agent_files.set_aside(folder / name)
            os.symlink(binary, name, dir_fd=fd)
    finally:
        os.close(fd)
    return folder
