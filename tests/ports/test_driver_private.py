"""PROTOCOL §9: the ports refuse the driver's own files (`state_dir/driver/`, the lock), even with
`state_dir` inside `cwd`, through a symlink, and through a hard link (which an agent can make only
where the provider tree sees the journal: `containment.degraded`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from driver.adapters.acp import fs as acp_fs
from driver.adapters.common.jsonrpc import JsonRpcError
from driver.interfaces import PathNotAllowed
from driver.ports import outputs
from driver.ports.files import AllowedRoots, driver_private


@pytest.fixture
def box(tmp_path: Path) -> tuple[AllowedRoots, Path, Path]:
    cwd = tmp_path / "cwd"
    state = cwd / ".state"  # the protocol's own example: state_dir inside cwd
    (state / "driver").mkdir(parents=True)
    (state / "providers").mkdir()
    journal = state / "driver" / "journal.sqlite3"
    journal.write_bytes(b"SQLite format 3\0 the journal")
    (state / "driver.lock").write_text("1\n")
    return AllowedRoots(cwd, private=driver_private(state)), cwd, journal


@pytest.mark.parametrize(
    "path", [".state/driver/journal.sqlite3", ".state/driver", ".state/driver.lock", ".state/driver/new.txt"]
)
def test_the_driver_state_is_not_admitted(box: tuple[AllowedRoots, Path, Path], path: str) -> None:
    roots, cwd, _ = box
    with pytest.raises(PathNotAllowed, match="driver's own state"):
        roots.admit(path)
    with pytest.raises(PathNotAllowed, match="driver's own state"):
        roots.admit(cwd / path)


def test_the_provider_home_and_cwd_are_admitted(box: tuple[AllowedRoots, Path, Path]) -> None:
    roots, cwd, _ = box
    assert roots.admit(".state/providers/x") == (cwd / ".state" / "providers" / "x").resolve()
    assert roots.admit("notes.txt") == (cwd / "notes.txt").resolve()
    assert roots.admit_directory(".state/providers") == (cwd / ".state" / "providers").resolve()


def test_a_symlink_to_the_journal_is_refused(box: tuple[AllowedRoots, Path, Path]) -> None:
    roots, cwd, journal = box
    (cwd / "j").symlink_to(journal)
    (cwd / "d").symlink_to(journal.parent, target_is_directory=True)
    for link in ("j", "d/journal.sqlite3", "d"):
        with pytest.raises(PathNotAllowed, match="driver's own state"):
            roots.admit(link)


def test_acp_fs_refuses_a_hard_link_to_the_journal_and_leaves_it_intact(box: tuple[AllowedRoots, Path, Path]) -> None:
    roots, cwd, journal = box
    os.link(journal, cwd / "h")
    path = roots.admit("h")  # the path says nothing: only the inode does
    with pytest.raises(JsonRpcError, match="driver's own state"):
        acp_fs._read(roots, path, None, None)
    with pytest.raises(JsonRpcError, match="driver's own state"):
        acp_fs._write(roots, path, "forged")
    assert journal.read_bytes() == b"SQLite format 3\0 the journal"  # not truncated either
    (cwd / "plain.txt").write_text("old")
    assert acp_fs._write(roots, roots.admit("plain.txt"), "new").created is False  # control
    assert (cwd / "plain.txt").read_text() == "new"


def test_a_folder_holding_the_driver_state_cannot_be_replaced(box: tuple[AllowedRoots, Path, Path]) -> None:
    roots, cwd, _ = box
    with pytest.raises(PathNotAllowed, match="holds the driver's own state"):
        roots.admit_tree(cwd / ".state")  # a skill mounted there would wipe the journal
    assert roots.admit_tree(cwd / ".skills" / "a") == (cwd / ".skills" / "a").resolve()


def test_outputs_never_report_the_driver_files(box: tuple[AllowedRoots, Path, Path]) -> None:
    roots, cwd, journal = box
    (cwd / "outputs").mkdir()
    os.link(journal, cwd / "outputs" / "copy.db")
    (cwd / "outputs" / "report.txt").write_text("r")
    report = outputs.changed(cwd, {}, private=roots.private_inodes())
    assert [c[0] for c in report.artifacts] == ["outputs/report.txt"]
    (cwd / "outputs").rename(cwd / "old-outputs")
    (cwd / "outputs").symlink_to(journal.parent, target_is_directory=True)
    report = outputs.changed(cwd, {}, private=roots.private_inodes())
    assert report.artifacts == [] and report.refused is not None


def test_process_start_cwd_rule(box: tuple[AllowedRoots, Path, Path], tmp_path: Path) -> None:
    roots, cwd, _ = box
    with pytest.raises(PathNotAllowed, match="driver's own state"):
        roots.admit_directory(".state/driver")
    with pytest.raises(PathNotAllowed, match="outside the allowed roots"):
        roots.admit_directory(tmp_path)
    (cwd / "f").write_text("")
    with pytest.raises(PathNotAllowed, match="not a directory"):
        roots.admit_directory("f")
