"""Real skill archives installed the real way (driver.ports.skills), for adapter tests."""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path

from driver.ports import skills
from driver.protocol.boot import Skill

# Distinctive words, so a test can find them in a model request and nowhere else.
SKILLS = (
    ("tide-tables", "Computes tide tables for harbour pilots from lunar phase data."),
    ("quill-lint", "Checks fountain-pen ink recipes for viscosity mistakes."),
)


def archive(name: str, description: str) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("SKILL.md", f"---\nname: {name}\ndescription: {description}\n---\n\n# {name}\n\nSteps here.\n")
        zf.writestr("scripts/run.sh", "echo ok\n")
    return buf.getvalue()


async def install_all(cwd: Path, archives_dir: Path) -> list[Skill]:
    """Install every skill of SKILLS under `cwd/.skills/<name>` (as the kernel does before start)."""
    archives_dir.mkdir(parents=True, exist_ok=True)
    entries: list[Skill] = []
    for name, description in SKILLS:
        data = archive(name, description)
        path = archives_dir / f"{name}.zip"
        path.write_bytes(data)
        entry = Skill(
            name=name,
            archive_url=path.as_uri(),
            sha256=hashlib.sha256(data).hexdigest(),
            mount_path=f".skills/{name}",
        )
        await skills.install(entry, cwd)
        entries.append(entry)
    return entries
