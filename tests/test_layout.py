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


# -- the layout (issue 31 item 1, docs/layout.md) --------------------------------------------------------
# A root of entry points and the few leaves every layer uses; families as packages; no import circle;
# no private name taken across modules; containment seen through its face.
ROOT_MODULES_MAX = 8


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources(*tops: str) -> dict[str, Path]:
    return {_module_name(p): p for top in tops for p in sorted((ROOT / top).rglob("*.py"))}


def _under_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _module_level_imports(body: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    """The imports a module runs when it is imported: its top level, inside `if`/`try` blocks, but not
    inside functions or classes (a deferred import, there to keep start-up lazy) and not under
    `TYPE_CHECKING` (annotations only)."""
    found: list[ast.Import | ast.ImportFrom] = []
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If) and not _under_type_checking(node):
            found += _module_level_imports(node.body) + _module_level_imports(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, *(h.body for h in node.handlers), node.orelse, node.finalbody):
                found += _module_level_imports(block)
    return found


def _imported_modules(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of `modules` that `name` imports at module level. `from pkg import mod` counts as
    the module `pkg.mod`; `from pkg.mod import X` as `pkg.mod`. A package's `__init__` that Python runs
    on the way to a submodule is not counted: every package of driver/ keeps its `__init__` free of
    imports except the containment face, whose own modules never import it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _module_level_imports(ast.parse(path.read_text(), str(path)).body):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
            continue
        base = node.module or ""
        if node.level:
            kept = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            base = ".".join([*kept, *([node.module] if node.module else [])])
        found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
    return {m for m in found if m in modules and m != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_root_holds_at_most_eight_modules() -> None:
    root = sorted(p.name for p in (ROOT / "driver").glob("*.py"))
    assert len(root) <= ROOT_MODULES_MAX, root


def test_no_import_circle_inside_the_daemon() -> None:
    modules = _sources("driver")
    graph = {name: _imported_modules(name, path, modules) for name, path in modules.items()}
    assert _cycles(graph) == []
    # the scan does see a circle where there is one, and the imports it follows
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert "driver.queue.journal_state" in graph["driver.queue.journal"]


def test_the_journal_state_does_not_import_the_journal() -> None:
    """Not even for annotations (the journal imports its state half; `Transaction` is a module of its own)."""
    assert "driver.queue.journal" not in _imports(ROOT / "driver" / "queue" / "journal_state.py")
    assert "driver.queue.journal_state" in _imports(ROOT / "driver" / "queue" / "journal.py")


def _private_names_taken(path: Path) -> list[str]:
    """`from x import _name`, and `mod._name` where `mod` is a module of driver/ or lab/ imported here."""
    tree = ast.parse(path.read_text(), str(path))
    ours = ("driver", "agent_lab")
    bound: set[str] = set()
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] in ours):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {alias.name}")
                bound.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] in ours}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and isinstance(node.value, ast.Name)
            and node.value.id in bound
        ):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_no_private_name_is_taken_across_modules() -> None:
    """In the daemon (tests may reach into a module they test; the lab's own are issue 31 item 3's)."""
    offenders = [hit for path in _sources("driver").values() for hit in _private_names_taken(path)]
    assert offenders == []
    assert _private_names_taken(ROOT / "tests" / "test_cli.py")  # the scan sees one where there is one


def test_other_packages_see_containment_through_its_face() -> None:
    face = "driver.containment"
    offenders = [
        f"{path.relative_to(ROOT)}: {name}"
        for module, path in _sources("driver", "lab").items()
        if not module.startswith(face + ".") and module != face
        for name in _imports(path) + _from_names(path)
        if name.startswith(face + ".") and name.removeprefix(face + ".") not in _face_exports()
    ]
    assert offenders == []


def _from_names(path: Path) -> list[str]:
    """`from pkg import name` as `pkg.name` (a submodule taken through its package)."""
    return [
        f"{node.module}.{alias.name}"
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0
        for alias in node.names
    ]


def _face_exports() -> set[str]:
    import driver.containment

    return set(driver.containment.__all__)


def test_runtime_packages_import_nothing_and_never_each_other() -> None:
    runtimes = ("codex", "claude", "acp")
    for package in (*runtimes, "common"):
        init = ROOT / "driver" / "adapters" / package / "__init__.py"
        assert _imports(init) == [], init  # the registry imports a runtime's `adapter` only when it runs
    for module, path in _sources("driver").items():
        parts = module.split(".")
        if parts[:2] != ["driver", "adapters"] or len(parts) < 4:
            continue
        own = parts[2]
        foreign = {r for r in runtimes if r != own}
        taken = {n.split(".")[2] for n in _imports(path) + _from_names(path) if n.startswith("driver.adapters.")}
        assert not taken & foreign, (module, taken & foreign)  # common/ imports no runtime either
