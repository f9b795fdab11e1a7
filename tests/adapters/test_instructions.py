"""The instruction text and skill discovery every adapter uses (driver/adapters/common/instructions.py)."""

from __future__ import annotations

from pathlib import Path

from driver.adapters.common import instructions
from driver.protocol.boot import ExecutionConfig, SessionConfig, Skill


def test_front_matter_plain_quoted_and_folded() -> None:
    text = "---\nname: 'pdf-tools'\ndescription: >\n  Fill PDF forms\n  and merge files.\nlicense: MIT\n---\n# x\n"
    assert instructions.front_matter(text) == {
        "name": "pdf-tools",
        "description": "Fill PDF forms and merge files.",
        "license": "MIT",
    }
    assert instructions.front_matter("# no front matter\nname: x\n") == {}


def test_installed_skills_and_links(tmp_path: Path) -> None:
    cwd = tmp_path / "cwd"
    (cwd / "sk" / "a").mkdir(parents=True)
    (cwd / "sk" / "a" / "SKILL.md").write_text('---\nname: alpha\ndescription: "Does A."\n---\n')
    entries = [
        Skill(name="a", archive_url="file:///x", sha256="0" * 64, mount_path="sk/a"),
        Skill(name="missing", archive_url="file:///y", sha256="1" * 64, mount_path="sk/b"),  # failed install
    ]
    found = instructions.installed_skills(cwd, entries)
    assert found == [instructions.SkillInfo("alpha", "Does A.", cwd / "sk" / "a")]
    native = tmp_path / "native"
    (native / ".system").mkdir(parents=True)  # the runtime's own: left alone
    (native / "stale").symlink_to(tmp_path)
    instructions.link_skills(found, native)
    instructions.link_skills(found, native)  # idempotent
    assert sorted(p.name for p in native.iterdir()) == [".system", "alpha"]
    assert (native / "alpha" / "SKILL.md").read_text().startswith("---")


def test_compose_names_outputs_memory_and_skills() -> None:
    execution = ExecutionConfig(revision="r", runtime="acp", system_prompt="Be brief.")
    pet = SessionConfig(id="s", agent_id="a", kind="pet", cwd="/w", state_dir="/s", memory_dir="/m")
    cattle = SessionConfig(id="s", agent_id="a", kind="cattle", cwd="/w", state_dir="/s")
    skill = instructions.SkillInfo("alpha", "Does A.", Path("/w/sk/a"))
    text = instructions.compose(execution, pet, [skill])
    assert text.startswith("Be brief.\n\n")
    assert "`outputs/`" in text and "/m" in text and "- alpha: Does A. (file: /w/sk/a/SKILL.md)" in text
    alone = instructions.compose(execution, cattle, own_prompt=False)
    assert "Be brief." not in alone and "memory" not in alone and "`outputs/`" in alone
