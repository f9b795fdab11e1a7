"""The outputs scan (driver.ports.outputs, PROTOCOL §6.5, §9): never leaves cwd, tolerates files that
vanish, skips what is not a regular file, and is bounded, saying what it cut."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from driver.ports import outputs
from driver.ports.outputs import Bounds, Snapshot


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_symlinked_outputs_or_one_that_is_a_file_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "secret").write_text("s")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / "outputs").symlink_to(elsewhere, target_is_directory=True)
    report = outputs.changed(cwd, Snapshot())
    assert report.artifacts == [] and report.refused is not None and "symbolic link" in report.refused
    (cwd / "outputs").unlink()
    (cwd / "outputs").write_text("a file")
    assert outputs.snapshot(cwd).refused == "outputs is not a directory"
    (cwd / "outputs").unlink()
    assert outputs.changed(cwd, Snapshot()).refused is None  # no outputs/ at all: nothing to say


def test_symlinks_fifos_and_excluded_folders_inside_are_not_followed(tmp_path: Path) -> None:
    out = tmp_path / "outputs"
    (out / "real").mkdir(parents=True)
    (out / "real" / "a.txt").write_bytes(b"a")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "b.txt").write_bytes(b"b")
    (out / "dirlink").symlink_to(tmp_path / "outside", target_is_directory=True)
    (out / "filelink").symlink_to(tmp_path / "outside" / "b.txt")
    os.mkfifo(out / "pipe")
    (out / "state").mkdir()
    (out / "state" / "journal").write_bytes(b"driver's own")
    report = outputs.changed(tmp_path, Snapshot(), exclude=[out / "state"])
    assert report.artifacts == [("outputs/real/a.txt", 1, sha(b"a"))]
    assert report.cut is None


def test_a_file_that_vanished_since_the_walk_is_skipped_and_the_rest_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "outputs"
    out.mkdir()
    for name in ("a", "b", "c"):
        (out / name).write_bytes(name.encode())
    walk = outputs.snapshot

    def walk_then_delete(*args: object, **kwargs: object) -> Snapshot:
        snap = walk(*args, **kwargs)  # type: ignore[arg-type]
        (out / "b").unlink()  # gone between the walk and its hash
        return snap

    monkeypatch.setattr(outputs, "snapshot", walk_then_delete)
    report = outputs.changed(tmp_path, Snapshot())
    assert [rel for rel, _, _ in report.artifacts] == ["outputs/a", "outputs/c"]
    assert report.cut is None


def test_new_and_changed_only(tmp_path: Path) -> None:
    out = tmp_path / "outputs"
    out.mkdir()
    (out / "same").write_bytes(b"1")
    (out / "edit").write_bytes(b"1")
    before = outputs.snapshot(tmp_path)
    (out / "edit").write_bytes(b"22")
    (out / "new").write_bytes(b"3")
    assert [r for r, _, _ in outputs.changed(tmp_path, before).artifacts] == ["outputs/edit", "outputs/new"]


def test_the_file_count_and_hashed_bytes_are_bounded(tmp_path: Path) -> None:
    out = tmp_path / "outputs"
    out.mkdir()
    for i in range(5):
        (out / f"f{i}").write_bytes(b"123456")
    by_count = outputs.changed(tmp_path, Snapshot(), bounds=Bounds(files=3))
    assert len(by_count.artifacts) == 3
    assert by_count.cut == outputs.Cut("files", 3, 2)
    by_bytes = outputs.changed(tmp_path, Snapshot(), bounds=Bounds(hash_bytes=15))
    assert [r for r, _, _ in by_bytes.artifacts] == ["outputs/f0", "outputs/f1"]
    assert by_bytes.cut == outputs.Cut("bytes", 2, 3)


def test_the_walk_is_bounded_in_entries_and_depth(tmp_path: Path) -> None:
    out = tmp_path / "outputs"
    deep = out.joinpath(*[f"d{i}" for i in range(6)])
    deep.mkdir(parents=True)
    (deep / "bottom").write_bytes(b"x")
    (out / "top").write_bytes(b"t")
    snap = outputs.snapshot(tmp_path, bounds=Bounds(depth=3))
    assert snap.truncated == "depth" and set(snap.files) == {"outputs/top"}
    report = outputs.changed(tmp_path, Snapshot(), bounds=Bounds(depth=3))
    assert report.cut is not None and report.cut.reason == "depth"
    for i in range(50):
        (out / f"w{i}").write_bytes(b"w")
    snap = outputs.snapshot(tmp_path, bounds=Bounds(entries=20))
    assert snap.truncated == "entries" and len(snap.files) <= 20


def test_names_that_are_not_utf8_are_scanned(tmp_path: Path) -> None:
    out = tmp_path / "outputs"
    out.mkdir()
    with open(os.fsencode(out) + b"/x\xff", "wb") as f:
        f.write(b"z")
    [(rel, size, digest)] = outputs.changed(tmp_path, Snapshot()).artifacts
    assert os.fsencode(rel) == b"outputs/x\xff" and size == 1 and digest == sha(b"z")


def test_the_time_spent_hashing_is_bounded(tmp_path: Path) -> None:
    out = tmp_path / "outputs"
    out.mkdir()
    (out / "a").write_bytes(b"a" * (1 << 20))  # more than one read: the clock is checked between reads
    report = outputs.changed(tmp_path, Snapshot(), bounds=Bounds(hash_s=-1.0))
    assert report.artifacts == [] and report.cut == outputs.Cut("time", 0, 1)
