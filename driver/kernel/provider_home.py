"""The provider's folder and home under `state_dir/providers/<runtime>/` (PROTOCOL §9, THREATS.md item 4).

Everything there belongs to the agent: its `$HOME` can be a file, a link or a fifo by the next start.
Each component that is not a folder is set aside (renamed to a fresh sibling name, never followed nor
deleted: the agent's bytes stay where it can find them) and said in a `provider.home_set_aside`
warning; then the folders are made below `state_dir` without following a link (driver.agent_files).
What still fails (the agent swapped a link in meanwhile) raises `AgentFileError`, which fails that
start of the provider, retried with backoff: never the driver.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from driver import agent_files, logs

log = logs.get("driver.kernel.provider_home")

SET_ASIDE = "provider.home_set_aside"


def prepare(state_dir: Path, runtime: str) -> tuple[Path, list[dict[str, Any]]]:
    """Make `state_dir/providers/<runtime>/home` a folder; return it and the diagnostics to say."""
    relative = Path("providers", runtime, "home")
    notes: list[dict[str, Any]] = []
    for depth in range(1, len(relative.parts) + 1):
        part = Path(*relative.parts[:depth])
        path = state_dir / part
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            break  # this and what is below it are made next
        except OSError:
            break  # make_folder names the problem
        if stat.S_ISDIR(mode):
            continue
        aside = agent_files.set_aside(path)
        kind = "a symbolic link" if stat.S_ISLNK(mode) else "not a folder"
        log.warning(SET_ASIDE, path=str(part), set_aside_as=aside.name, kind=kind)
        notes.append(
            {
                "code": SET_ASIDE,
                "severity": "warning",
                "message": f"{part} was {kind}; it was set aside as {aside.name} and a folder made in its place",
                "details": {"path": str(part), "set_aside_as": aside.name},
            }
        )
        break  # what stood there is gone with everything below it
    return agent_files.make_folder(state_dir, relative), notes
