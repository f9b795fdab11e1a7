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


# -- task groups (issue 30, THREATS.md item 5) ----------------------------------------------------------
# Only driver/tasks.py opens a task group and starts tasks on it; every other module gets a `Tasks`
# (guarded spawns only). A raw `start_soon` whose task raised took the driver down once.
RAW_TASK_GROUP = {"create_task_group", "TaskGroup", "start_soon", "open_nursery"}


def _raw_task_group_uses(path: Path) -> list[str]:
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
        if name in RAW_TASK_GROUP:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}")  # type: ignore[attr-defined]
        if isinstance(node, ast.ImportFrom) and node.module in ("anyio", "anyio.abc", "asyncio", "trio"):
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            found += [f"{where}: {a.name}" for a in node.names if a.name in RAW_TASK_GROUP]
    return found


def test_only_the_task_module_touches_a_raw_task_group() -> None:
    offenders = [
        use
        for path in sorted((ROOT / "driver").rglob("*.py"))
        if path != ROOT / "driver" / "tasks.py"
        for use in _raw_task_group_uses(path)
    ]
    assert offenders == []
    assert _raw_task_group_uses(ROOT / "driver" / "tasks.py")  # the scan does see a use where there is one
