"""Skills (PROTOCOL §6.4): zip archives fetched, verified and unpacked under `cwd` before start.

The archive is checked entry by entry before anything is written: absolute paths, `..`, symlinks and
device or other special files are refused. It is extracted into a temporary folder beside the target,
then renamed into place, so a provider never sees half a skill.
"""

from __future__ import annotations

import shutil
import stat
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import anyio

from driver.ports.fetch import FetchError, fetch
from driver.protocol.boot import Skill

MAX_ARCHIVE_BYTES = 64 * 1024 * 1024
MAX_UNPACKED_BYTES = 256 * 1024 * 1024
SKILL_DEADLINE_S = 120.0  # the default overall deadline of one skill (KernelOptions.skill_timeout_s)


class SkillError(Exception):
    pass


@dataclass(frozen=True, slots=True)
class InstalledSkill:
    name: str
    path: Path
    reused: bool = False  # already installed from an archive with the same sha256: nothing fetched


def _target(cwd: Path, mount_path: str) -> Path:
    rel = PurePosixPath(mount_path)
    if rel.is_absolute() or ".." in rel.parts or not rel.parts:
        raise SkillError(f"mount_path must be a relative path inside cwd: {mount_path!r}")
    target = (cwd / rel).resolve()
    if not target.is_relative_to(cwd.resolve()):
        raise SkillError(f"mount_path escapes cwd: {mount_path!r}")
    return target


def check_archive(zf: zipfile.ZipFile) -> None:
    total = 0
    for info in zf.infolist():
        name = PurePosixPath(info.filename)
        if name.is_absolute() or info.filename.startswith(("/", "\\")) or ".." in name.parts:
            raise SkillError(f"archive entry escapes its folder: {info.filename!r}")
        # Unix type bits live in the high half of external_attr; zero means "unspecified" (a plain file).
        kind = stat.S_IFMT(info.external_attr >> 16)
        if kind and kind not in (stat.S_IFREG, stat.S_IFDIR):
            raise SkillError(f"archive entry is a link or special file: {info.filename!r}")
        total += info.file_size
        if total > MAX_UNPACKED_BYTES:
            raise SkillError("archive unpacks to more than the limit")


def _unpack(archive: Path, target: Path) -> None:
    with zipfile.ZipFile(archive) as zf:
        check_archive(zf)
        staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-"))
        try:
            zf.extractall(staging)
            if target.exists():
                shutil.rmtree(target)
            staging.rename(target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise


def _marker(target: Path) -> Path:
    """Beside the skill folder (not in it, so the model never sees it): the sha256 it was unpacked from."""
    return target.parent / f".{target.name}.sha256"


def _installed_hash(target: Path) -> str | None:
    try:
        return _marker(target).read_text().strip() if target.is_dir() else None
    except OSError:
        return None


async def install(skill: Skill, cwd: Path, *, deadline_s: float = SKILL_DEADLINE_S) -> InstalledSkill:
    """Install one skill, within `deadline_s` overall (its fetch and unpacking); a skill already
    unpacked from an archive with the same hash is kept as it is (a pet's restart, a provider
    replacement), without fetching anything."""
    with anyio.move_on_after(deadline_s):
        return await _install(skill, cwd, deadline_s)
    raise SkillError(f"not installed within {deadline_s:g} s")


async def _install(skill: Skill, cwd: Path, deadline_s: float) -> InstalledSkill:
    target = _target(cwd, skill.mount_path)
    if _installed_hash(target) == skill.sha256:
        return InstalledSkill(skill.name, target, reused=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    # Resolved: the download walks its directory without following symlinks (fetch_to).
    archive = target.parent.resolve() / f".{target.name}.zip"
    try:
        await fetch(skill.archive_url, archive, sha256=skill.sha256, max_bytes=MAX_ARCHIVE_BYTES, deadline_s=deadline_s)
        _marker(target).unlink(missing_ok=True)
        await anyio.to_thread.run_sync(_unpack, archive, target)
        _marker(target).write_text(skill.sha256 + "\n")
    except (FetchError, zipfile.BadZipFile, OSError) as exc:
        raise SkillError(str(exc)) from None
    finally:
        archive.unlink(missing_ok=True)
    return InstalledSkill(skill.name, target)
