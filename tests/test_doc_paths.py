"""Every repository path and `python -m` module the README, PROTOCOL.md and docs/ name exists (issue 35).

The docs are read when the test runs (other changes rename and add files), and a name counts as a repo
path when its first segment is one of the checkout's own top-level entries (tracked by git), or
`agent_lab/` (the lab's package, under lab/); link targets are resolved from the doc's own folder.
Code spans and fenced blocks are both read.
Brace lists (`test_{claude,codex}.py`) are expanded, globs must match something, and a `:line` or
`::test` suffix is dropped. What a doc names as a place *inside a sandbox* (`state_dir/driver/`) or in a
scratch folder (`boot/boot.json`) does not start with a top-level entry and is not checked.
"""

from __future__ import annotations

import importlib.util
import itertools
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "PROTOCOL.md", *sorted((ROOT / "docs").glob("*.md"))]
SPAN = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
LINK = re.compile(r"\]\(([^)\s]+)\)")
PYTHON_M = re.compile(r"python3? -m ([A-Za-z_][\w.]*)")
TOKEN = re.compile(r"[A-Za-z0-9_.{},*/-]+")


def top_level() -> set[str]:
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return {line.split("/", 1)[0] for line in tracked.splitlines()} - {".gitignore"}


def expand(path: str) -> list[str]:
    m = re.search(r"\{([^{}]*)\}", path)
    if m is None:
        return [path]
    return list(
        itertools.chain.from_iterable(expand(path[: m.start()] + alt + path[m.end() :]) for alt in m[1].split(","))
    )


def exists(path: str, base: Path) -> bool:
    if path.startswith("agent_lab/"):
        path = "lab/" + path
    target = (base / path) if not path.startswith("/") else Path(path)
    if any(c in path for c in "*?["):
        return any(base.glob(path))
    return target.exists()


def named_paths(doc: Path, tops: set[str]) -> list[tuple[str, Path]]:
    """(path, folder it is relative to) of every repo path `doc` names."""
    text = doc.read_text()
    found: list[tuple[str, Path]] = []
    for target in LINK.findall(text):
        target = target.split("#", 1)[0]
        if target and "://" not in target and not target.startswith("mailto:"):
            found.append((target, doc.parent))
    fenced = FENCE.findall(text)
    for span in [*fenced, *SPAN.findall(FENCE.sub("", text))]:
        for token in TOKEN.findall(span):
            token = token.split("::", 1)[0].rstrip(".,;:")
            token = re.sub(r":\d+$", "", token)
            first = token.split("/", 1)[0]
            is_root_file = token in tops and "." in token
            if ("/" in token and (first in tops or first == "agent_lab")) or is_root_file:
                found.append((token, ROOT))
    return found


def modules(doc: Path) -> list[str]:
    return PYTHON_M.findall(doc.read_text())


def module_exists(name: str) -> bool:
    parts = name.split(".")
    for base in (ROOT, ROOT / "lab"):
        here = base.joinpath(*parts)
        if here.with_suffix(".py").is_file() or (here / "__init__.py").is_file() or (here / "__main__.py").is_file():
            return True
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def test_the_docs_name_paths_at_all() -> None:
    # A guard against a broken extractor passing vacuously.
    tops = top_level()
    readme = {p for p, _ in named_paths(ROOT / "README.md", tops)}
    assert {"driver/protocol/", "lab/agent_lab/controlplane/", "docs/protocol.md"} <= readme, sorted(readme)
    assert "agent_lab.testing.fake_anthropic" in modules(ROOT / "README.md")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_path_and_module_a_doc_names_exists(doc: Path) -> None:
    tops = top_level()
    missing = sorted(
        {p for path, base in named_paths(doc, tops) for p in expand(path) if not exists(p, base)}
        | {f"python -m {m}" for m in modules(doc) if not module_exists(m)}
    )
    assert not missing, f"{doc.relative_to(ROOT)} names what does not exist: {missing}"
