"""Two distributions from one repository (issue 26): the daemon's wheel holds the daemon alone and
declares exactly what it imports; the laboratory's wheel holds the lab, with the test agents and the
benches that `agent-driver evidence` runs, so evidence works from an install."""

from __future__ import annotations

import ast
import email
import importlib.util
import re
import sys
import zipfile
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

from tests.image.sandbox import ROOT, build_lab_wheel, build_wheel

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    out = tmp_path_factory.mktemp("wheels")
    yield build_wheel(out / "daemon"), build_lab_wheel(out / "lab")


def names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        return z.namelist()


def wheel_metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as z:
        (path,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        return email.message_from_bytes(z.read(path))


def requirements(meta: email.message.Message) -> dict[str | None, set[str]]:
    """Requires-Dist by extra (None: the core), as normalized distribution names."""
    out: dict[str | None, set[str]] = {}
    for req in meta.get_all("Requires-Dist") or []:
        name = re.split(r"[\s;<>=!~\[(]", req, maxsplit=1)[0]
        extra = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", req)
        out.setdefault(extra.group(1) if extra else None, set()).add(normalize(name))
    return out


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def imported_modules(package: Path) -> dict[str, set[Path]]:
    """Third-party modules (dotted names) imported anywhere in `package`, with the files importing them."""
    found: dict[str, set[Path]] = {}
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            mods = []
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                # `from opentelemetry import trace`: the submodule, where it is one, names the distribution.
                mods = [_submodule(node.module, a.name) for a in node.names]
            for mod in mods:
                top = mod.split(".")[0]
                if top not in sys.stdlib_module_names and top != package.name:
                    found.setdefault(mod, set()).add(path.relative_to(ROOT))
    return found


def _submodule(module: str, name: str) -> str:
    if module.split(".")[0] in sys.stdlib_module_names:
        return module
    try:
        return f"{module}.{name}" if importlib.util.find_spec(f"{module}.{name}") is not None else module
    except (ImportError, ValueError):
        return module


def distribution_of(module: str) -> str:
    """The installed distribution whose files hold `module` (namespace packages such as opentelemetry
    are shared by several: the module's own file decides)."""
    candidates = metadata.packages_distributions().get(module.split(".")[0], [])
    if len(set(candidates)) == 1:
        return normalize(candidates[0])
    spec = importlib.util.find_spec(module)
    origin = Path(spec.origin).resolve() if spec is not None and spec.origin else None
    for dist in dict.fromkeys(candidates):
        files = metadata.distribution(dist).files or []
        if origin is not None and any(Path(str(f.locate())).resolve() == origin for f in files):
            return normalize(dist)
    raise AssertionError(f"no installed distribution holds {module} (candidates: {candidates})")


def test_the_daemon_wheel_holds_the_daemon_alone(wheels: tuple[Path, Path]) -> None:
    daemon, _ = wheels
    files = names(daemon)
    assert any(n == "driver/cli.py" for n in files)
    strays = [n for n in files if not n.startswith(("driver/", "agent_driver-"))]
    assert not strays, f"the daemon's wheel carries more than the daemon: {strays}"
    assert not [n for n in files if "agent_lab" in n or n.startswith(("tests/", "bench/"))]


def test_the_daemon_declares_exactly_what_it_imports(wheels: tuple[Path, Path]) -> None:
    declared = requirements(wheel_metadata(wheels[0]))
    imports = imported_modules(ROOT / "driver")
    # The OTLP exporter is loaded only when a payload names an endpoint: the `telemetry` extra.
    optional = {m for m in imports if m.split(".")[0] == "opentelemetry"}
    core = {distribution_of(m) for m in imports if m not in optional}
    extra = {distribution_of(m) for m in optional}
    # Not imported but run: the Claude Code CLI that claude-agent-sdk ships (the driver speaks its wire).
    from driver.adapters.claude.options import bundled_cli

    cli = bundled_cli()
    assert cli is not None and distribution_of("claude_agent_sdk") == "claude-agent-sdk"
    assert "_bundled" in cli.parts and "claude_agent_sdk" in cli.parts
    core.add("claude-agent-sdk")
    assert declared.get(None) == core, f"core: declared {declared.get(None)}, imported {core}"
    assert declared.get("telemetry") == extra, f"telemetry: declared {declared.get('telemetry')}, imported {extra}"


def test_the_lab_wheel_carries_the_lab_with_its_agents_and_benches(wheels: tuple[Path, Path]) -> None:
    _, lab = wheels
    files = names(lab)
    assert not [n for n in files if not n.startswith(("agent_lab/", "agent_driver_lab-"))]
    for needed in (
        "agent_lab/testing/agents/stubborn_acp_agent.py",
        "agent_lab/testing/agents/flood_acp_agent.py",
        "agent_lab/bench/__main__.py",
        "agent_lab/bench/cold_start.py",
        "agent_lab/bench/steer.py",
        "agent_lab/bench/cancel_evidence.py",
        "agent_lab/bench/_driven.py",
        "agent_lab/evidence/cli.py",
        "agent_lab/evidence/dialer.py",
        "agent_lab/controlplane/console/static/index.html",
    ):
        assert needed in files, f"the lab's wheel lacks {needed}"
    assert "agent-driver" in requirements(wheel_metadata(lab)).get(None, set())


def test_evidence_loads_nothing_from_a_checkout() -> None:
    """What `agent-driver evidence` runs (its claims and the benches they start), and the rest of the lab
    (every bench included), must not read tests/ or a checkout-relative bench/: those are not in an
    install of `agent-driver-lab`."""
    offenders = []
    lab = ROOT / "lab" / "agent_lab"
    for path in lab.rglob("*.py"):
        text = path.read_text()
        if re.search(r"""from tests\b|import tests\b|["']tests["']|-m", f?"bench\.""", text):
            offenders.append(str(path.relative_to(ROOT)))
    assert not offenders, offenders
