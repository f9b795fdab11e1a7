"""The arrow runs one way: the laboratory (`agent_lab`) imports the daemon (`driver`), never the reverse.

A sandbox image installs the daemon's wheel alone, so a module of `driver/` that imported the lab would
fail there; this scans every import statement of the daemon (a dynamic import by name is allowed only
in `driver/cli.py`, which says in one line which package to install when the lab is missing)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _imports(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def test_the_daemon_never_imports_the_lab() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in sorted((ROOT / "driver").rglob("*.py"))
        for name in _imports(path)
        if name == "agent_lab" or name.startswith(("agent_lab.", "tests", "bench"))
    ]
    assert offenders == []


def test_the_lab_lives_outside_the_daemon_package() -> None:
    for room in ("controlplane", "testing", "evidence", "dev"):
        assert not (ROOT / "driver" / room).exists(), room
        assert (ROOT / "lab" / "agent_lab" / room).is_dir(), room
