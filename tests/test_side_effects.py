"""driver.kernel.side_effects: the cwd scan and its diff, and the process tree reader."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from driver.kernel import side_effects


def test_files_changed_names_created_modified_and_deleted(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("same")
    (tmp_path / "edit.txt").write_text("old")
    (tmp_path / "gone.txt").write_text("bye")
    (tmp_path / "state").mkdir()
    before = side_effects.snapshot(tmp_path, [tmp_path / "state"])
    (tmp_path / "edit.txt").write_text("newer content")
    (tmp_path / "gone.txt").unlink()
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "new.txt").write_text("hi")
    (tmp_path / "state" / "journal").write_text("ignored: the driver's own state")
    after = side_effects.snapshot(tmp_path, [tmp_path / "state"])
    assert side_effects.files_changed(before, after) == [
        {"path": "edit.txt", "change": "modified"},
        {"path": "gone.txt", "change": "deleted"},
        {"path": os.path.join("sub", "new.txt"), "change": "created"},
    ]


def test_a_scan_over_its_bound_says_so_and_claims_no_deletions(tmp_path: Path) -> None:
    for i in range(10):
        (tmp_path / f"f{i}").write_text("x")
    full = side_effects.snapshot(tmp_path, [])
    cut = side_effects.snapshot(tmp_path, [], limit=4)
    assert cut.truncated and len(cut.files) == 4 and not full.truncated
    assert side_effects.files_changed(full, cut) == []


# Prints the sleeper's pid once `sleep` has exec'd: Popen returns while the fork may still be python.
SPAWNS_A_SLEEPER = """
import subprocess, time
p = subprocess.Popen(["sleep", "30"])
while not open(f"/proc/{p.pid}/cmdline", "rb").read().startswith(b"sleep"):
    pass
print(p.pid, flush=True)
time.sleep(30)
"""


def test_tree_processes_finds_live_descendants_only(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", SPAWNS_A_SLEEPER], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        grandchild = int(child.stdout.readline())
        found = {p["pid"]: p["argv0"] for p in side_effects.tree_processes([os.getpid()])}
        assert found[child.pid] == sys.executable and found[grandchild] == "sleep"
        os.kill(grandchild, 9)
        # Its parent never reaps it: a zombie is not a process left running.
        with open(f"/proc/{grandchild}/stat") as f:
            while f.read().rsplit(")", 1)[1].split()[0] != "Z":  # the kill lands asynchronously
                f.seek(0)
        found = {p["pid"] for p in side_effects.tree_processes([child.pid])}
        assert child.pid in found and grandchild not in found
    finally:
        child.kill()
        child.wait()
    assert child.pid not in {p["pid"] for p in side_effects.tree_processes([os.getpid()])}
