"""Skills, attachments and artifacts (PROTOCOL §6.4, §6.5) on real files."""

from __future__ import annotations

import hashlib
import io
import stat
import zipfile
from pathlib import Path

import pytest

from driver.ports import artifacts, outputs, skills
from driver.ports.fetch import FetchError, fetch_to
from driver.protocol.boot import Skill
from driver.protocol.commands import Attachment


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_zip(entries: dict[str, bytes], *, symlink: str | None = None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
        if symlink:
            info = zipfile.ZipInfo(symlink)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            zf.writestr(info, "/etc/passwd")
    return buf.getvalue()


def test_fetch_checks_hash_and_size_and_leaves_nothing_on_failure(tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    src.write_bytes(b"x" * 1000)
    dest = tmp_path / "out" / "f.bin"
    assert fetch_to(src.as_uri(), dest, sha256=sha(b"x" * 1000), max_bytes=1000) == 1000
    assert dest.read_bytes() == b"x" * 1000
    with pytest.raises(FetchError, match="sha256"):
        fetch_to(src.as_uri(), tmp_path / "out" / "g.bin", sha256="0" * 64, max_bytes=5000)
    with pytest.raises(FetchError, match="limit"):
        fetch_to(src.as_uri(), tmp_path / "out" / "h.bin", sha256=sha(b"x" * 1000), max_bytes=999)
    with pytest.raises(FetchError, match="scheme"):
        fetch_to("ftp://example/x", tmp_path / "out" / "i.bin", sha256="0" * 64, max_bytes=10)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["f.bin"]


async def test_skill_installs_atomically(tmp_path: Path) -> None:
    archive = tmp_path / "skill.zip"
    data = make_zip({"SKILL.md": b"# hello", "lib/util.py": b"x = 1"})
    archive.write_bytes(data)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    got = await skills.install(
        Skill(name="s", archive_url=archive.as_uri(), sha256=sha(data), mount_path=".skills/s"), cwd
    )
    assert got.path == (cwd / ".skills" / "s").resolve()
    assert (got.path / "lib" / "util.py").read_text() == "x = 1"
    # Nothing left behind but the skill and the record of the hash it was unpacked from.
    assert sorted(p.name for p in (cwd / ".skills").iterdir()) == [".s.sha256", "s"]


async def test_reinstalling_the_same_archive_is_a_no_op(tmp_path: Path) -> None:
    archive = tmp_path / "skill.zip"
    data = make_zip({"SKILL.md": b"# v1"})
    archive.write_bytes(data)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    entry = Skill(name="s", archive_url=archive.as_uri(), sha256=sha(data), mount_path="skills/s")
    first = await skills.install(entry, cwd)
    assert not first.reused
    (first.path / "notes.txt").write_text("kept")  # proof the folder is not unpacked again
    archive.unlink()  # and nothing is fetched: the archive is gone
    again = await skills.install(entry, cwd)
    assert again.reused and again.path == first.path and (again.path / "notes.txt").read_text() == "kept"
    # Another hash is a new version: fetched and unpacked in place of the old one.
    data2 = make_zip({"SKILL.md": b"# v2"})
    archive.write_bytes(data2)
    newer = await skills.install(
        Skill(name="s", archive_url=archive.as_uri(), sha256=sha(data2), mount_path="skills/s"), cwd
    )
    assert not newer.reused and (newer.path / "SKILL.md").read_text() == "# v2"
    assert not (newer.path / "notes.txt").exists()


@pytest.mark.parametrize(
    ("entries", "symlink", "message"),
    [
        ({"../evil.txt": b"x"}, None, "escapes"),
        ({"/abs.txt": b"x"}, None, "escapes"),
        ({"ok.txt": b"x"}, "link", "link or special"),
    ],
)
async def test_skill_refuses_unsafe_archives(
    tmp_path: Path, entries: dict[str, bytes], symlink: str | None, message: str
) -> None:
    data = make_zip(entries, symlink=symlink)
    archive = tmp_path / "bad.zip"
    archive.write_bytes(data)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    with pytest.raises(skills.SkillError, match=message):
        await skills.install(Skill(name="b", archive_url=archive.as_uri(), sha256=sha(data), mount_path="b"), cwd)
    assert not (cwd / "b").exists()
    assert not (tmp_path / "evil.txt").exists()


async def test_skill_mount_path_must_stay_inside_cwd(tmp_path: Path) -> None:
    with pytest.raises(skills.SkillError, match="mount_path"):
        await skills.install(Skill(name="b", archive_url="file:///x", sha256="0" * 64, mount_path="../out"), tmp_path)


async def test_attachments_are_downloaded_into_inputs(tmp_path: Path) -> None:
    src = tmp_path / "a.txt"
    src.write_bytes(b"hello")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    att = Attachment(name="a.txt", url=src.as_uri(), sha256=sha(b"hello"), size=5)
    saved = await artifacts.download_attachments(cwd, [att])
    assert saved[0][1] == cwd / "inputs" / "a.txt"
    assert (cwd / "inputs" / "a.txt").read_bytes() == b"hello"
    with pytest.raises(artifacts.AttachmentError, match="plain file name"):
        artifacts.attachment_path(cwd, "../x")
    wrong_size = Attachment(name="b.txt", url=src.as_uri(), sha256=sha(b"hello"), size=4)
    with pytest.raises(artifacts.AttachmentError, match=r"b\.txt"):
        await artifacts.download_attachments(cwd, [wrong_size])
    assert not (cwd / "inputs" / "b.txt").exists()


def test_changed_outputs_reports_new_and_modified_only(tmp_path: Path) -> None:
    out = tmp_path / "outputs"
    out.mkdir()
    (out / "same.txt").write_text("same")
    (out / "edit.txt").write_text("v1")
    before = outputs.snapshot(tmp_path)
    (out / "edit.txt").write_text("version 2")
    (out / "sub").mkdir()
    (out / "sub" / "new.txt").write_text("new")
    (out / "link").symlink_to(tmp_path / "outputs" / "same.txt")
    changed = {p: (size, digest) for p, size, digest in outputs.changed(tmp_path, before).artifacts}
    assert set(changed) == {"outputs/edit.txt", "outputs/sub/new.txt"}
    assert changed["outputs/edit.txt"] == (9, sha(b"version 2"))
