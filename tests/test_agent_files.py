"""driver.agent_files: writes never follow a planted link, reads are bounded before they start."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from driver import agent_files
from driver.agent_files import AgentFileError


def test_a_write_replaces_a_planted_link_and_leaves_its_target_alone(tmp_path: Path) -> None:
    victim = tmp_path / "journal.sqlite3"
    victim.write_bytes(b"precious")
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").symlink_to(victim)
    agent_files.write_file(tmp_path, "home/config.toml", b"model = 'x'\n")
    assert victim.read_bytes() == b"precious"
    assert not (home / "config.toml").is_symlink()
    assert (home / "config.toml").read_bytes() == b"model = 'x'\n"
    assert sorted(p.name for p in home.iterdir()) == ["config.toml"]  # no temporary name left behind


def test_a_write_refuses_a_linked_folder_on_the_way(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "home").symlink_to(elsewhere)
    with pytest.raises(AgentFileError, match="symbolic link"):
        agent_files.write_file(tmp_path, "home/config.toml", b"x")
    assert list(elsewhere.iterdir()) == []


def test_a_planted_temporary_name_is_not_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "config.toml.tmp").symlink_to(victim)  # the old fixed temporary name
    agent_files.write_file(tmp_path, "home/config.toml", b"new")
    assert victim.read_bytes() == b"precious"
    assert (tmp_path / "home" / "config.toml").read_bytes() == b"new"


def test_a_folder_where_the_file_should_be_is_named(tmp_path: Path) -> None:
    (tmp_path / "home" / "config.toml").mkdir(parents=True)
    with pytest.raises(AgentFileError, match="folder stands where a file should be"):
        agent_files.write_file(tmp_path, "home/config.toml", b"x")


def test_reads_refuse_links_fifos_and_sparse_giants_before_reading(tmp_path: Path) -> None:
    (tmp_path / "real").write_bytes(b"abc")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    os.mkfifo(tmp_path / "fifo")
    with open(tmp_path / "sparse", "wb") as f:
        f.truncate(64 * 1024 * 1024)
    assert agent_files.read_file(tmp_path, "real", max_bytes=3) == b"abc"
    with pytest.raises(AgentFileError, match="symbolic link"):
        agent_files.read_file(tmp_path, "link", max_bytes=10)
    with pytest.raises(AgentFileError, match="not a regular file"):
        agent_files.read_file(tmp_path, "fifo", max_bytes=10)
    with pytest.raises(AgentFileError, match="over the 1024-byte limit"):
        agent_files.read_file(tmp_path, "sparse", max_bytes=1024)
    with pytest.raises(AgentFileError, match="no such file"):
        agent_files.read_file(tmp_path, "missing", max_bytes=10)


def test_paths_that_climb_are_refused(tmp_path: Path) -> None:
    for bad in ("../x", "/etc/passwd", "a/../b", ""):
        with pytest.raises(AgentFileError):
            agent_files.write_file(tmp_path, bad, b"x")


def test_a_file_where_a_folder_should_be_can_be_set_aside(tmp_path: Path) -> None:
    (tmp_path / "home").write_bytes(b"not a folder")
    with pytest.raises(AgentFileError):
        agent_files.make_folder(tmp_path, "home")
    aside = agent_files.set_aside(tmp_path / "home")
    assert aside.read_bytes() == b"not a folder"
    assert agent_files.make_folder(tmp_path, "home").is_dir()
