"""`agent-driver evidence` from an install (issue 26): both wheels, built from the sources, installed
into a fresh venv made from Debian's python3, run from a folder outside the checkout with nothing of it
on the path. Only `node_modules` (the pinned runtimes) is taken from the checkout, named by
AGENT_DRIVER_PROJECT_ROOT as in the image. The `events` claim runs the flood ACP agent, which must come
from the installed lab."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.image.sandbox import PIP, ROOT, SYSTEM_PYTHON, build_lab_wheel, build_wheel, run

pytestmark = [pytest.mark.image, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def installed() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="agent-driver-install-"))
    try:
        daemon, lab = build_wheel(base / "build"), build_lab_wheel(base / "build")
        venv = base / "venv"
        run([SYSTEM_PYTHON, "-m", "venv", "--without-pip", venv])
        run([PIP, "--python", venv / "bin" / "python", "install", "--quiet", daemon, lab])
        yield venv
    finally:
        shutil.rmtree(base, ignore_errors=True)


def env_of(venv: Path) -> dict[str, str]:
    return {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(venv.parent),
            "AGENT_DRIVER_PROJECT_ROOT": str(ROOT)}  # fmt: skip


def test_the_install_imports_nothing_from_the_checkout(installed: Path) -> None:
    code = "import driver, agent_lab.testing.agents as a; print(driver.__file__, a.__file__, a.FLOOD, a.STUBBORN)"
    done = run([installed / "bin" / "python", "-c", code], env=env_of(installed), cwd=installed.parent)
    for path in done.stdout.split():
        assert str(installed) in path and not path.startswith(str(ROOT)), path
        assert Path(path).exists()


def test_evidence_runs_from_the_install(installed: Path, tmp_path: Path) -> None:
    out = tmp_path / "events.json"
    done = subprocess.run(
        [str(installed / "bin" / "agent-driver"), "evidence", "--claim", "events", "--runtime", "acp",
         "--quick", "--no-bench", "--json", str(out)],
        env=env_of(installed), cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    report = json.loads(out.read_text())
    (claim,) = report["claims"]
    assert (claim["claim"], claim["runtime"], claim["verdict"]) == ("events", "acp", "passed"), claim
    assert not os.path.exists(tmp_path / "tests"), "evidence must not need a checkout's tests/"
