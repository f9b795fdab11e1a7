"""Skills (PROTOCOL §6.4): zip archives fetched, verified and unpacked under `cwd` before start.

The archive is checked entry by entry before anything is written: absolute paths, `..`, symlinks and
device or other special files are refused. It is extracted into a temporary folder beside the target,
then renamed into place, so a provider never sees half a skill.

`cwd` is the agent's (PROTOCOL §9): every folder, entry and marker is written through driver.agent_files
below the resolved `cwd` (a link the agent planted, in the staging folder while it fills or at the
marker's name, is refused, never followed), and the marker is read bounded, without following a link.
The marker decides only whether to unpack again what the agent could change anyway.
"""

from __future__ import annotations

import os
import secrets
import shutil
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import anyio

from driver import agent_files
from driver.ports.fetch import FetchError, fetch
from driver.protocol.boot import Skill

MAX_ARCHIVE_BYTES = 64 * 1024 * 1024
MAX_UNPACKED_BYTES = 256 * 1024 * 1024
MARKER_MAX_BYTES = 128  # a sha256 in hex and a newline
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


def _unpack(archive: Path, root: Path, rel: Path) -> None:
    """Unpack into a fresh staging folder beside `root/rel`, then rename it over `root/rel`."""
    with zipfile.ZipFile(archive) as zf:
        check_archive(zf)
        staging = rel.parent / f".{rel.name}-{secrets.token_hex(6)}"
        agent_files.make_folder(root, staging, mode=0o755)
        try:
            for info in zf.infolist():
                name = PurePosixPath(info.filename)
                if not name.parts:
                    continue
                if info.is_dir():
                    agent_files.make_folder(root, staging / name, mode=0o755)
                else:
                    agent_files.write_file(root, staging / name, zf.read(info), mode=0o644)
            _replace(root, rel, staging)
        except BaseException:
            shutil.rmtree(root / staging, ignore_errors=True)
            raise


def _replace(root: Path, rel: Path, staging: Path) -> None:
    """Rename `staging` over `rel` (both in one folder), relative to that folder's descriptor; what
    stood at `rel` goes first (a folder removed without following links, a file or link unlinked)."""
    fd = agent_files.open_folder(root, rel.parent)
    try:
        try:
            mode = os.stat(rel.name, dir_fd=fd, follow_symlinks=False).st_mode
        except FileNotFoundError:
            mode = None
        if mode is not None and stat.S_ISDIR(mode):
            shutil.rmtree(root / rel)  # fd-based on Linux: it never follows a link inside
        elif mode is not None:
            os.unlink(rel.name, dir_fd=fd)
        os.rename(staging.name, rel.name, src_dir_fd=fd, dst_dir_fd=fd)
    finally:
        os.close(fd)


def _marker(rel: Path) -> Path:
    """Beside the skill folder (not in it, so the model never sees it): the sha256 it was unpacked from."""
    return rel.parent / f".{rel.name}.sha256"


def _installed_hash(root: Path, rel: Path) -> str | None:
    try:
        if not stat.S_ISDIR(os.lstat(root / rel).st_mode):
            return None
        return agent_files.read_file(root, _marker(rel), max_bytes=MARKER_MAX_BYTES).decode().strip()
    except (OSError, agent_files.AgentFileError, UnicodeDecodeError):
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
    root = cwd.resolve()
    rel = target.relative_to(root)
    if _installed_hash(root, rel) == skill.sha256:
        return InstalledSkill(skill.name, target, reused=True)
    try:
        agent_files.make_folder(root, rel.parent)
    except agent_files.AgentFileError as exc:
        raise SkillError(str(exc)) from None
    # Resolved: the download walks its directory without following symlinks (fetch_to).
    archive = target.parent / f".{target.name}.zip"
    try:
        await fetch(skill.archive_url, archive, sha256=skill.sha256, max_bytes=MAX_ARCHIVE_BYTES, deadline_s=deadline_s)
        (root / _marker(rel)).unlink(missing_ok=True)  # unlink never follows a link
        await anyio.to_thread.run_sync(_unpack, archive, root, rel)
        agent_files.write_file(root, _marker(rel), (skill.sha256 + "\n").encode(), mode=0o644)
    except (FetchError, zipfile.BadZipFile, OSError, agent_files.AgentFileError) as exc:
        raise SkillError(str(exc)) from None
    finally:
        archive.unlink(missing_ok=True)
    return InstalledSkill(skill.name, target)
