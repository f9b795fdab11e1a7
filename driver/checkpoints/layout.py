"""Where each runtime keeps its native session, and which of its files a checkpoint may carry
(PROTOCOL §8.1; the allowlist and how it was found are in docs/protocol.md, "Native checkpoints").

Two families of files, found by reading each runtime's resume path and verified by resuming from a
copy in an empty home with the real runtime:
- **claude** (the Claude Code CLI, under `claude-agent-sdk`, and `claude-agent-acp`, which runs the same
  CLI): `projects/<folder of the cwd>/<session id>.jsonl`, plus any regular file under
  `projects/<folder>/<session id>/` (subagent transcripts, large tool results). The folder is derived
  from the cwd (`claude_project_folder`), so a restore places the files under the folder the NEW cwd
  derives.
- **codex** (`openai-app-server` and `codex-acp`): the rollout
  `sessions/YYYY/MM/DD/rollout-<timestamp>-<thread id>.jsonl` under `CODEX_HOME`.

Nothing else: no `.claude.json`, `sessions/*.key` (the CLI's peer token), `auth.json`, config, caches,
SQLite state or another session's file. Paths are POSIX, relative to the runtime's native home.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

from driver.protocol.boot import ExecutionConfig

Family = Literal["claude", "codex"]

# A native ref names files: only ids of this shape are looked up or restored (no glob, no `/`).
_REF = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")
_DATE = re.compile(r"^\d{4}$|^\d{2}$")
_CLAUDE_FOLDER_MAX = 200  # the CLI's limit before it appends a hash
# What one session's folder may hold for a checkpoint (PROTOCOL §9: the folder is the agent's; a tree of a
# million files, or one a thousand levels deep, is refused before it is walked further).
MAX_FILES = 4096
MAX_ENTRIES = 4 * MAX_FILES  # in any one folder walked (other sessions' files share a day's folder)
MAX_DEPTH = 8  # folders below the session's own (a subagent's transcript is 1 deep)
_ACP_AGENTS: dict[str, Family] = {"codex-acp": "codex", "claude-agent-acp": "claude", "claude-code-acp": "claude"}


class TooMany(Exception):
    """The session's folder holds more files, or deeper folders, than a checkpoint takes."""

    def __init__(self, message: str, what: str, limit: int) -> None:
        super().__init__(message)
        self.what = what
        self.limit = limit

    def details(self, ref: str) -> dict[str, object]:
        return {self.what: self.limit, "native_ref": ref}


@dataclass(frozen=True)
class Layout:
    family: Family
    home: Path  # the runtime's native home: manifest paths are relative to it


def claude_project_folder(cwd: str) -> str:
    """The Claude Code CLI's folder name for a cwd (read from the CLI bundled in claude-agent-sdk): every
    UTF-16 code unit that is not [A-Za-z0-9] becomes '-'; a name over 200 characters is cut to 200 and
    followed by '-' and the base-36 absolute value of the Java-style 32-bit hash of the cwd."""
    raw = cwd.encode("utf-16-le", "surrogatepass")
    units = [int.from_bytes(raw[i : i + 2], "little") for i in range(0, len(raw), 2)]
    name = "".join(chr(u) if 48 <= u <= 57 or 65 <= u <= 90 or 97 <= u <= 122 else "-" for u in units)
    if len(name) <= _CLAUDE_FOLDER_MAX:
        return name
    h = 0
    for u in units:
        h = (h * 31 + u) & 0xFFFFFFFF
    if h >= 1 << 31:
        h -= 1 << 32
    return f"{name[:_CLAUDE_FOLDER_MAX]}-{_base36(abs(h))}"


def _base36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if n == 0:
            return out


def layout_for(execution: ExecutionConfig, provider_dir: Path) -> Layout | None:
    """The layout of the runtime `execution` runs, with its home as the driver configures it
    (driver/adapters/claude/options.py, codex_files.py; an ACP agent's from its environment), or None
    for an ACP agent whose layout the driver does not know."""
    env = execution.environment
    if execution.runtime == "claude-agent-sdk":
        return Layout("claude", Path(env.get("CLAUDE_CONFIG_DIR") or provider_dir / "claude-config"))
    if execution.runtime == "openai-app-server":
        return Layout("codex", provider_dir / "codex-home")
    if execution.acp is None or not execution.acp.command:
        return None
    family = acp_family(execution.acp.command)
    if family is None:
        return None
    agent_env: Mapping[str, str] = {"HOME": str(provider_dir / "home"), **env, **execution.acp.env}
    home = agent_env["HOME"]
    if family == "codex":
        return Layout("codex", Path(agent_env.get("CODEX_HOME") or Path(home) / ".codex"))
    return Layout("claude", Path(agent_env.get("CLAUDE_CONFIG_DIR") or Path(home) / ".claude"))


def acp_family(command: list[str]) -> Family | None:
    """The known ACP agent an argv runs (its program, or a script of a known package run by node)."""
    for part in command[:2]:
        for name, family in _ACP_AGENTS.items():
            if name in PurePosixPath(part).parts or PurePosixPath(part).name == name:
                return family
    return None


def valid_ref(ref: str) -> bool:
    return bool(_REF.match(ref))


def allowed(family: Family, rel: str, ref: str) -> bool:
    """Whether `rel` is a path the allowlist admits for session `ref` (checked again on restore: a
    payload cannot make the driver write a config file or another session's)."""
    if not valid_ref(ref) or rel.startswith("/") or "\\" in rel or "\0" in rel:
        return False
    parts = PurePosixPath(rel).parts
    if any(p in ("", ".", "..") for p in parts) or PurePosixPath(rel).as_posix() != rel:
        return False
    if family == "claude":
        if len(parts) == 3 and parts[0] == "projects":
            return parts[2] == f"{ref}.jsonl"
        return len(parts) >= 4 and parts[0] == "projects" and parts[2] == ref
    return (
        len(parts) == 5
        and parts[0] == "sessions"
        and all(_DATE.match(p) for p in parts[1:4])
        and parts[4].startswith("rollout-")
        and parts[4].endswith(f"-{ref}.jsonl")
    )


def restore_path(family: Family, rel: str, cwd: str) -> str:
    """Where a checkpointed file goes in a new sandbox: a Claude session under the folder the NEW cwd
    derives (the CLI looks for it there), anything else where it was."""
    if family != "claude":
        return rel
    parts = list(PurePosixPath(rel).parts)
    parts[1] = claude_project_folder(cwd)
    return "/".join(parts)


def session_files(layout: Layout, ref: str) -> list[str]:
    """The allowlisted files of session `ref` that exist under the home, sorted. Symbolic links are
    never followed (the agent is not trusted: a link planted at a session path must not carry another
    file into a checkpoint). `TooMany` past `MAX_FILES` files or `MAX_DEPTH` folders."""
    if not valid_ref(ref):
        return []
    found: list[str] = []
    if layout.family == "claude":
        projects = layout.home / "projects"
        for folder in _dirs(projects):
            base = projects / folder.name
            if _is_file(base / f"{ref}.jsonl"):
                found.append(f"projects/{folder.name}/{ref}.jsonl")
            if _is_dir(base / ref):
                for sub in _walk(base / ref):
                    found.append(f"projects/{folder.name}/{ref}/{sub}")
                    if len(found) > MAX_FILES:
                        raise TooMany(f"the session holds more than {MAX_FILES} files", "max_files", MAX_FILES)
    else:
        sessions = layout.home / "sessions"
        for year in _dirs(sessions):
            for month in _dirs(Path(year.path)):
                for day in _dirs(Path(month.path)):
                    for entry in _entries(Path(day.path)):
                        rel = f"sessions/{year.name}/{month.name}/{day.name}/{entry.name}"
                        if entry.is_file(follow_symlinks=False) and allowed("codex", rel, ref):
                            found.append(rel)
    return sorted(r for r in found if allowed(layout.family, r, ref))


def _entries(path: Path) -> list[os.DirEntry[str]]:
    out: list[os.DirEntry[str]] = []
    try:
        with os.scandir(path) as it:
            for entry in it:
                out.append(entry)
                if len(out) > MAX_ENTRIES:
                    message = f"a folder of the session holds more than {MAX_ENTRIES} entries"
                    raise TooMany(message, "max_entries", MAX_ENTRIES)
    except OSError:
        return []
    return out


def _dirs(path: Path) -> list[os.DirEntry[str]]:
    return [e for e in _entries(path) if e.is_dir(follow_symlinks=False)]


def _is_file(path: Path) -> bool:
    try:
        return path.is_file() and not path.is_symlink()
    except OSError:
        return False


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir() and not path.is_symlink()
    except OSError:
        return False


def _walk(root: Path, prefix: str = "", depth: int = 0) -> Iterator[str]:
    for entry in _entries(root):
        rel = f"{prefix}{entry.name}"
        if entry.is_dir(follow_symlinks=False):
            if depth >= MAX_DEPTH:
                raise TooMany(f"the session's folders are deeper than {MAX_DEPTH}", "max_depth", MAX_DEPTH)
            yield from _walk(Path(entry.path), rel + "/", depth + 1)
        elif entry.is_file(follow_symlinks=False):
            yield rel
