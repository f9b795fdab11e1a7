"""Codex's files: the pinned platform binary inside node_modules, the generated CODEX_HOME (config.toml
and skills), the helper aliases Codex dispatches on, and file digests for `file.changed`.
"""

from __future__ import annotations

import hashlib
import os
import platform
import stat
from pathlib import Path

from driver.adapters import instructions
from driver.adapters.base import AdapterConfig, ProviderError
from driver.adapters.codex_config import CodexConfigError, CodexSettings, render_config, settings_from

# npm package suffix and Rust target triple of the platform binary, by machine.
_PLATFORMS = {
    "x86_64": ("linux-x64", "x86_64-unknown-linux-musl"),
    "amd64": ("linux-x64", "x86_64-unknown-linux-musl"),
    "aarch64": ("linux-arm64", "aarch64-unknown-linux-musl"),
    "arm64": ("linux-arm64", "aarch64-unknown-linux-musl"),
}
_HELPER_NAMES = ("codex-linux-sandbox",)


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


def sha256_file(path: str) -> str | None:
    """The sha256 of a regular file; None for one that is gone or is not a regular file (a FIFO the
    agent left under that name is opened without blocking, and refused)."""
    digest = hashlib.sha256()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return None
            for block in iter(lambda: f.read(1 << 16), b""):
                digest.update(block)
    except OSError:
        return None
    return digest.hexdigest()


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
    home = config.state_dir / "codex-home"
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    (home / "config.toml").write_text(text)
    # Skills (PROTOCOL §6.4) the native way: Codex lists what CODEX_HOME/skills holds to the model.
    skills = instructions.installed_skills(Path(config.session.cwd), execution.skills)
    if skills:
        instructions.link_skills(skills, home / "skills")
    return home, extra_env, settings


def helper_aliases(state_dir: Path, binary: Path) -> Path:
    """A folder of links to the binary under the helper names Codex dispatches on argv[0]
    (`codex-linux-sandbox` runs commands inside the sandbox). Codex makes these itself under
    CODEX_HOME, but refuses when CODEX_HOME is under the temporary directory, and then every
    sandboxed command fails with "execvp codex-linux-sandbox: No such file"."""
    folder = state_dir / "codex-bin"
    folder.mkdir(parents=True, exist_ok=True)
    for name in _HELPER_NAMES:
        link = folder / name
        if link.is_symlink() and os.readlink(link) == str(binary):
            continue
        link.unlink(missing_ok=True)
        link.symlink_to(binary)
    return folder
