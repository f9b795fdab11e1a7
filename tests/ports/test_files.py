"""Path admission and the open that follows it (issue 11): a parent directory swapped for a symlink
between a path's admission and its open must not redirect the open out of the allowed roots."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from driver.adapters.acp import fs as acp_fs
from driver.adapters.common.jsonrpc import JsonRpcError
from driver.interfaces import PathNotAllowed
from driver.ports.artifacts import attachment_path
from driver.ports.fetch import FetchError, fetch_to
from driver.ports.files import AllowedRoots, open_admitted


@pytest.fixture
def roots(tmp_path: Path) -> AllowedRoots:
    (tmp_path / "cwd" / "sub").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    return AllowedRoots(tmp_path / "cwd")


def swap_for_link(directory: Path, target: Path) -> None:
    """What an agent's tool can do at any moment: replace a directory by a symlink out of the roots."""
    directory.rename(directory.with_name(directory.name + ".old"))
    directory.symlink_to(target, target_is_directory=True)


def test_write_through_a_swapped_parent_is_refused(roots: AllowedRoots, tmp_path: Path) -> None:
    path = roots.admit("sub/new.txt")
    swap_for_link(tmp_path / "cwd" / "sub", tmp_path / "outside")
    with pytest.raises(JsonRpcError, match=r"symbolic link|not a directory"):
        acp_fs._write(roots, path, "escaped")
    assert list((tmp_path / "outside").iterdir()) == []


def test_write_through_a_swapped_grandparent_is_refused(roots: AllowedRoots, tmp_path: Path) -> None:
    path = roots.admit("sub/deeper/new.txt")  # parents created on write
    swap_for_link(tmp_path / "cwd" / "sub", tmp_path / "outside")
    with pytest.raises(JsonRpcError):
        acp_fs._write(roots, path, "escaped")
    assert list((tmp_path / "outside").iterdir()) == []


def test_read_through_a_swapped_parent_is_refused(roots: AllowedRoots, tmp_path: Path) -> None:
    (tmp_path / "outside" / "secret.txt").write_text("outside secret")
    (tmp_path / "cwd" / "sub" / "secret.txt").write_text("inside")
    path = roots.admit("sub/secret.txt")
    swap_for_link(tmp_path / "cwd" / "sub", tmp_path / "outside")
    with pytest.raises(JsonRpcError):
        acp_fs._read(roots, path, None, None)


def test_write_and_read_inside_the_roots_still_work(roots: AllowedRoots, tmp_path: Path) -> None:
    path = roots.admit("sub/a/b/c.txt")
    result = acp_fs._write(roots, path, "hello")
    assert result.created and (tmp_path / "cwd" / "sub" / "a" / "b" / "c.txt").read_text() == "hello"
    assert acp_fs._read(roots, path, None, None) == "hello"


def test_attachment_into_a_swapped_inputs_directory_is_refused(tmp_path: Path) -> None:
    cwd = tmp_path / "cwd"
    (cwd / "inputs").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    src = tmp_path / "src.bin"
    src.write_bytes(b"payload")
    dest = attachment_path(cwd, "a.bin")
    AllowedRoots(cwd).admit(dest)
    swap_for_link(cwd / "inputs", tmp_path / "outside")
    with pytest.raises(FetchError, match=r"symbolic link|not a directory"):
        fetch_to(src.as_uri(), dest, sha256=hashlib.sha256(b"payload").hexdigest(), max_bytes=100)
    assert list((tmp_path / "outside").iterdir()) == []


@pytest.mark.parametrize(
    "bad",
    ["../outside/x", "/etc/passwd", "sub/../../outside/x", "a\0b", "x" * 300, "/".join(["d"] * 2100)],
)
def test_paths_outside_or_unusable_are_refused(roots: AllowedRoots, bad: str) -> None:
    with pytest.raises(PathNotAllowed):
        roots.admit(bad)


def test_open_admitted_refuses_a_symlink_planted_as_the_file(roots: AllowedRoots, tmp_path: Path) -> None:
    target = tmp_path / "outside" / "t.txt"
    target.write_text("keep")
    path = roots.admit("sub/link.txt")
    (tmp_path / "cwd" / "sub" / "link.txt").symlink_to(target)
    with pytest.raises(OSError):
        os.close(open_admitted(path, os.O_WRONLY | os.O_TRUNC))
    assert target.read_text() == "keep"
