"""`agent-driver run`'s arguments, read without argparse (its import is on every start's path)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from driver.cli import RunArgs, _run_args

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["run"], RunArgs(None, "info")),
        (["run", "--boot-file", "/b.json"], RunArgs("/b.json", "info")),
        (["run", "--boot-file=/b.json", "--log-level", "debug"], RunArgs("/b.json", "debug")),
        (["run", "--log-level=warning", "--boot-file", "/b"], RunArgs("/b", "warning")),
    ],
)
def test_run_arguments_are_read_directly(argv: list[str], expected: RunArgs) -> None:
    assert _run_args(argv) == expected


@pytest.mark.parametrize(
    "argv",
    [["run", "--help"], ["run", "--boot-file"], ["run", "--unknown", "x"], ["run", "extra"], ["dev"], []],
)
def test_anything_else_is_left_to_argparse(argv: list[str]) -> None:
    assert _run_args(argv) is None


def test_argparse_still_refuses_what_the_fast_path_does_not_read() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "driver.cli", "run", "--bogus"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert "unrecognized arguments: --bogus" in proc.stderr


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "driver.cli", *argv], capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_prints_the_version_and_exits_zero(flag: str) -> None:
    from driver import __version__

    proc = cli(flag)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"agent-driver {__version__}"


def test_the_package_version_is_the_driver_version() -> None:
    from importlib.metadata import version

    from driver import __version__

    assert version("agent-driver") == __version__


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["run", "--frobnicate"], "unrecognized arguments: --frobnicate"),
        (["run", "--log-level", "loud"], "invalid choice: 'loud'"),
        (["dev", "--nope"], "unrecognized arguments: --nope"),
        (["evidence", "--nope"], "unrecognized arguments: --nope"),
        (["controlplane", "--nope"], "--nope"),
        (["bench", "--nope"], "--nope"),
        (["frob"], "invalid choice: 'frob'"),
    ],
)
def test_unknown_flags_and_commands_name_themselves(argv: list[str], named: str) -> None:
    proc = cli(*argv)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert named in proc.stderr


@pytest.mark.parametrize(
    ("argv", "mentions"),
    [
        ([], "--version"),
        (["run"], "--boot-file"),
        (["dev"], "--runtime"),
        (["evidence"], "--claim"),
        (["controlplane"], "--token-file"),
        (["bench"], "cold_start"),
    ],
)
def test_every_subcommand_has_help(argv: list[str], mentions: str) -> None:
    proc = cli(*argv, "--help")
    assert proc.returncode == 0, proc.stderr
    assert mentions in proc.stdout


def test_a_missing_laboratory_is_named_in_one_line(tmp_path: Path) -> None:
    # A daemon-only install: agent_lab cannot be imported (a stub package that refuses to load).
    stub = tmp_path / "agent_lab"
    stub.mkdir()
    (stub / "__init__.py").write_text("raise ModuleNotFoundError(name='agent_lab')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    for command in ("controlplane", "evidence", "dev", "bench"):
        proc = subprocess.run(
            [sys.executable, "-m", "driver.cli", command], capture_output=True, text=True, timeout=60, env=env
        )
        assert proc.returncode == 2, (command, proc.stderr)
        assert proc.stderr.count("\n") == 1 and "pip install agent-driver-lab" in proc.stderr, proc.stderr
