"""The image's files agree with each other: Dockerfile labels and ENV, package.json, the runtime
check, docs/providers.md. Fast (no build)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.image.sandbox import ROOT, _instructions, dockerfile_env, dockerfile_labels, final_stage

pytestmark = pytest.mark.image

NODE = ROOT / "node_modules" / ".bin" / "node"
CHECK = ROOT / "scripts" / "check-runtimes.mjs"
PINS: dict[str, str] = json.loads((ROOT / "package.json").read_text())["dependencies"]
LABEL_OF = {
    "node": "io.agent-driver.node",
    "@openai/codex": "io.agent-driver.runtime.openai-codex",
    "@zed-industries/codex-acp": "io.agent-driver.runtime.codex-acp",
    "@agentclientprotocol/claude-agent-acp": "io.agent-driver.runtime.claude-agent-acp",
}


def test_labels_carry_every_pin() -> None:
    labels = dockerfile_labels()
    assert set(LABEL_OF) == set(PINS), "a new pin in package.json needs a label"
    assert {name: labels.get(label) for name, label in LABEL_OF.items()} == PINS


def test_the_python_provider_sdk_is_pinned_and_labelled() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    m = re.search(r'"claude-agent-sdk==([0-9][^"]*)"', pyproject)
    assert m is not None, "claude-agent-sdk must be pinned exactly in pyproject.toml"
    assert dockerfile_labels().get("io.agent-driver.runtime.claude-agent-sdk") == m.group(1)


def test_docs_list_the_versions_the_image_carries() -> None:
    section = (ROOT / "docs" / "providers.md").read_text().split("## What the image carries", 1)[1]
    for name, version in PINS.items():
        row = next((line for line in section.splitlines() if line.startswith(f"| `{name}`") or
                    (name == "node" and line.startswith("| Node |"))), None)  # fmt: skip
        assert row is not None and f"| {version} |" in row, f"docs/providers.md: {name} {version}"


def test_the_final_stage_is_non_root_without_build_tools_or_healthcheck() -> None:
    text = (ROOT / "Dockerfile").read_text()
    words = [word for word, _ in _instructions(text)]
    assert words.count("FROM") >= 2, "multi-stage"
    assert "HEALTHCHECK" not in words
    final = final_stage(text)
    assert ("USER", "10001:10001") in final
    installs = " ".join(args for word, args in final if word == "RUN")
    for tool in ("npm", "nodejs", "python3-venv", "build-essential"):
        assert f" {tool} " not in f" {installs} ", f"{tool} belongs in the build stage"
    env = dockerfile_env(text)
    assert env["AGENT_DRIVER_PROJECT_ROOT"] == "/opt/agent-driver"
    assert env["PATH"].split(":")[:2] == ["/opt/agent-driver/venv/bin", "/opt/agent-driver/node_modules/.bin"]


def test_check_runtimes_passes_and_reports_the_pins() -> None:
    done = subprocess.run([NODE, CHECK, ROOT, "--json"], capture_output=True, text=True, check=True)
    versions = json.loads(done.stdout)
    assert versions["node"] == PINS["node"]
    assert {k: v["version"] for k, v in versions.items() if k != "node"} == {
        k: v for k, v in PINS.items() if k != "node"
    }


def fake_project(tmp_path: Path, pins: dict[str, str], packages: dict[str, dict[str, object]]) -> Path:
    (tmp_path / "package.json").write_text(json.dumps({"dependencies": pins}))
    for name, manifest in packages.items():
        folder = tmp_path / "node_modules" / name
        folder.mkdir(parents=True)
        (folder / "package.json").write_text(json.dumps({"name": name, **manifest}))
    return tmp_path


def check(project: Path, node: Path | str = NODE) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(node), CHECK, project], capture_output=True, text=True)


def test_check_runtimes_names_what_is_wrong(tmp_path: Path) -> None:
    project = fake_project(
        tmp_path,
        {"node": PINS["node"], "agent-a": "1.0.0", "agent-b": "2.0.0"},
        {"agent-a": {"version": "1.1.0"}, "dep-c": {"version": "3.0.0", "engines": {"node": ">=99"}}},
    )
    done = check(project)
    assert done.returncode == 1
    assert "agent-a is installed at 1.1.0 but package.json pins 1.0.0" in done.stderr
    assert "agent-b 2.0.0 is pinned in package.json but not installed" in done.stderr
    assert f"dep-c 3.0.0 needs node >=99, but this Node is {PINS['node']}" in done.stderr


def test_check_runtimes_refuses_another_node(tmp_path: Path) -> None:
    project = fake_project(tmp_path, {"node": "1.2.3"}, {})
    done = check(project)
    assert done.returncode == 1
    assert f"this Node is {PINS['node']} but package.json pins node 1.2.3" in done.stderr
