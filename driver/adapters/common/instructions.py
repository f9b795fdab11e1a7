"""What every runtime is told besides the prompt: the execution's system prompt, a short paragraph of
the driver's own (where artifacts go, where a pet's memory lives) and the installed skills (§6.4).

Plain functions over the boot payload and the files the kernel unpacked (no provider import):
- `installed_skills` reads each installed skill's `SKILL.md` front matter (name, description);
- `link_skills` exposes them in a runtime's native skills folder (Claude Code's, Codex's), as links
  to the folders under `cwd`, so the model reads and the runtime lists the very files we installed;
- `compose` builds the instruction text for a runtime's system prompt (or its first prompt, for an
  ACP agent that takes no system prompt), with a skills section where there is no native mechanism.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from driver import agent_files, logs
from driver.protocol.boot import ExecutionConfig, SessionConfig, Skill

SKILL_FILE = "SKILL.md"
log = logs.get("driver.adapters.instructions")

_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")
_MAX_DESCRIPTION = 1024
_MAX_SKILL_HEAD = 64 * 1024  # the front matter is at the head; the rest of SKILL.md is the model's to read


@dataclass(frozen=True, slots=True)
class SkillInfo:
    name: str
    description: str
    path: Path  # the installed folder (holds SKILL.md)

    @property
    def folder_name(self) -> str:
        """A file-system-safe name for a native skills folder entry."""
        return _SAFE_NAME.sub("-", self.name).strip(".-") or "skill"


def front_matter(text: str) -> dict[str, str]:
    """The scalar keys of a Markdown file's YAML front matter (`---` ... `---`).

    Only what SKILL.md uses: `key: value` (plain or quoted) and folded/literal blocks (`>` / `|`).
    A full YAML parser would be one more dependency for two fields."""
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        return {}
    out: dict[str, str] = {}
    i = 1
    while i < len(lines) and lines[i].strip() != "---":
        line = lines[i]
        i += 1
        if not line.strip() or line.startswith((" ", "\t", "#")) or ":" not in line:
            continue
        key, _, value = line.partition(":")
        value = value.strip()
        if value in (">", "|", ">-", "|-", ">+", "|+"):
            block: list[str] = []
            while i < len(lines) and (lines[i].startswith((" ", "\t")) or not lines[i].strip()):
                block.append(lines[i].strip())
                i += 1
            joiner = "\n" if value.startswith("|") else " "
            value = joiner.join(b for b in block if b) if joiner == " " else "\n".join(block).strip()
        elif len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        out[key.strip()] = value
    return out


def installed_skills(cwd: Path, skills: Iterable[Skill]) -> list[SkillInfo]:
    """The skills of the execution that are installed under `cwd` (a failed install is skipped: the
    kernel reported it). The name and description come from SKILL.md, falling back to the entry's."""
    found: list[SkillInfo] = []
    for skill in skills:
        folder = cwd / skill.mount_path
        # The folder is the agent's (cwd, PROTOCOL §9): SKILL.md may have become a fifo (a plain open
        # held the driver's event loop for good), a sparse giant or a link to the driver's own files.
        try:
            head = agent_files.read_head(cwd, Path(skill.mount_path) / SKILL_FILE, max_bytes=_MAX_SKILL_HEAD)
        except agent_files.AgentFileError as exc:
            if os.path.lexists(folder / SKILL_FILE):
                log.warning("skill.unreadable", skill=skill.name, error=str(exc))
            continue
        text = head.decode("utf-8", errors="replace")
        meta = front_matter(text)
        name = meta.get("name") or skill.name
        description = meta.get("description", "")[:_MAX_DESCRIPTION]
        found.append(SkillInfo(name, description, folder))
    return found


def link_skills(skills: Sequence[SkillInfo], folder: Path, root: Path | None = None) -> None:
    """Make `folder/<name>` a link to each skill's installed folder (and drop links of skills no
    longer in the execution). The folder is the agent's (under `state_dir/providers/`, PROTOCOL §9):
    it is opened below `root` (default: its parent) without following a link, and every link is made,
    read and removed relative to that descriptor, so a link planted in its place is never followed."""
    relative = folder.relative_to(root) if root is not None else Path(folder.name)
    start = root if root is not None else folder.parent
    start.mkdir(parents=True, exist_ok=True)  # the trusted start of the walk (the runtime's config folder)
    try:
        path_fd = agent_files.open_folder(start, relative, create=True)
    except agent_files.AgentFileError:
        # A file or a link the agent left where a folder should be (the skills folder, or the runtime's
        # config folder above it): refusing it alone failed every later start of the runtime (on every
        # later driver too). The first such component is set aside (kept, renamed).
        if not _set_aside_first_non_folder(start, relative):
            raise
        path_fd = agent_files.open_folder(start, relative, create=True)
    try:
        fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=path_fd)
    finally:
        os.close(path_fd)
    try:
        wanted = {s.folder_name: s.path for s in skills}
        for name in os.listdir(fd):
            if name not in wanted and _is_link(name, fd):
                os.unlink(name, dir_fd=fd)
        for name, target in wanted.items():
            if _is_link(name, fd):
                if os.readlink(name, dir_fd=fd) == str(target):
                    continue
                os.unlink(name, dir_fd=fd)
            elif _exists(name, fd):
                continue  # a real folder of the runtime's own (e.g. Codex's system skills): not ours to touch
            os.symlink(target, name, target_is_directory=True, dir_fd=fd)
    finally:
        os.close(fd)


def _set_aside_first_non_folder(start: Path, relative: Path) -> bool:
    for depth in range(1, len(relative.parts) + 1):
        path = start.joinpath(*relative.parts[:depth])
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return False
        if not stat.S_ISDIR(mode):
            aside = agent_files.set_aside(path)
            log.warning("skills.folder_set_aside", path=str(path.relative_to(start)), set_aside_as=aside.name)
            return True
    return False


def _is_link(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except FileNotFoundError:
        return False


def _exists(name: str, dir_fd: int) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def driver_paragraph(session: SessionConfig) -> str:
    lines = [
        "Working environment (from agent-driver):",
        f"- Your working directory is {session.cwd}. Files you place under `outputs/` there are "
        "delivered to the user as artifacts of this run; files the user attached are under `inputs/`.",
    ]
    if session.kind == "pet" and session.memory_dir:
        lines.append(
            f"- Your memory directory is {session.memory_dir}. It is kept across restarts of this agent: "
            "keep notes there that you want to remember in later sessions."
        )
    return "\n".join(lines)


def skills_paragraph(skills: Sequence[SkillInfo]) -> str:
    if not skills:
        return ""
    lines = [
        "Skills: each is a folder with a SKILL.md holding its instructions. When a task matches a "
        "skill's description, read its SKILL.md first and follow it."
    ]
    lines += [f"- {s.name}: {s.description} (file: {s.path / SKILL_FILE})" for s in skills]
    return "\n".join(lines)


def skill_paths_paragraph(skills: Sequence[SkillInfo]) -> str:
    """For a runtime that lists skills natively without their location: where each one's files are."""
    if not skills:
        return ""
    lines = ["Your skills are installed here (each folder holds its SKILL.md and the files it refers to):"]
    lines += [f"- {s.name}: {s.path}" for s in skills]
    return "\n".join(lines)


def compose(
    execution: ExecutionConfig, session: SessionConfig, skills: Sequence[SkillInfo] = (), *, own_prompt: bool = True
) -> str:
    """The instruction text: the execution's system prompt (when `own_prompt`; a runtime that sends it
    separately passes False), the driver's paragraph, then the skills section (for a runtime without a
    native skills mechanism; pass no skills otherwise)."""
    parts = [execution.system_prompt.strip() if own_prompt else "", driver_paragraph(session), skills_paragraph(skills)]
    return "\n\n".join(p for p in parts if p)
