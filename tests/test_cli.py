"""`agent-driver run`'s arguments, read without argparse (its import is on every start's path)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from driver.cli import RunArgs, _run_args


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
