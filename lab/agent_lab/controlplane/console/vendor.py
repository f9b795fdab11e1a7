"""The console's third-party scripts, served from the project's `node_modules` (installed by `make
setup` from package.json's pins; never copied into the repository): xterm.js for the terminals.

Only the files named here are served, by name, so no request reaches anything else in node_modules.
"""

from __future__ import annotations

import os
from pathlib import Path

# URL name -> (path under node_modules, content type)
FILES: dict[str, tuple[str, str]] = {
    "xterm.js": ("@xterm/xterm/lib/xterm.js", "text/javascript; charset=utf-8"),
    "xterm.css": ("@xterm/xterm/css/xterm.css", "text/css; charset=utf-8"),
    "addon-fit.js": ("@xterm/addon-fit/lib/addon-fit.js", "text/javascript; charset=utf-8"),
}


def node_modules() -> Path:
    """The project's node_modules: $AGENT_DRIVER_PROJECT_ROOT's, else the checkout's this file is in."""
    root = os.environ.get("AGENT_DRIVER_PROJECT_ROOT")
    return Path(root) / "node_modules" if root else Path(__file__).resolve().parents[4] / "node_modules"


def read(name: str) -> tuple[bytes, str] | None:
    """(the bytes, their content type), or None for a name not served or a file not installed."""
    entry = FILES.get(name)
    if entry is None:
        return None
    try:
        return (node_modules() / entry[0]).read_bytes(), entry[1]
    except OSError:
        return None
