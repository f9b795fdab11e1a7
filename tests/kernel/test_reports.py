"""driver.kernel.reports without I/O: the `side_effects` payload and the artifact events."""

from __future__ import annotations

from driver.kernel.reports import OUTPUT_BOUNDS, artifact_events, side_effects_of
from driver.kernel.side_effects import TreeSnapshot
from driver.ports import outputs


def _tree(files: dict[str, tuple[int, int]], *, truncated: bool = False) -> TreeSnapshot:
    snap = TreeSnapshot()
    snap.files.update(files)
    snap.truncated = truncated
    return snap


def test_side_effects_name_the_changes_and_say_when_the_picture_is_incomplete() -> None:
    before = _tree({"a.txt": (1, 10), "b.txt": (1, 10)})
    after = _tree({"a.txt": (2, 10), "c.txt": (1, 10)})
    left = [{"pid": 41, "argv0": "sleep"}]
    effects = side_effects_of(before, after, left)
    assert {c["path"]: c["change"] for c in effects["files_changed"]} == {
        "a.txt": "modified",
        "b.txt": "deleted",
        "c.txt": "created",
    }
    assert effects["processes_left"] == left and effects["truncated"] is False
    # A scan that failed (None) or hit its bound: no diff claimed, and the payload says so.
    assert side_effects_of(None, after, None) == {"files_changed": [], "processes_left": [], "truncated": True}
    assert side_effects_of(before, _tree({}, truncated=True), left)["truncated"] is True


def test_artifacts_become_events_and_a_refused_or_cut_scan_a_diagnostic() -> None:
    assert artifact_events(outputs.Report(), "run-1") == []
    report = outputs.Report(
        artifacts=[("outputs/a.txt", 3, "ab" * 32)], refused="outputs is a symlink", cut=outputs.Cut("files", 1, 4)
    )
    events = artifact_events(report, "run-1")
    assert events[0] == ("artifact.produced", {"path": "outputs/a.txt", "size": 3, "sha256": "ab" * 32})
    assert [(k, p["code"]) for k, p in events[1:]] == [
        ("diagnostic.reported", "artifacts.refused"),
        ("diagnostic.reported", "artifacts.truncated"),
    ]
    cut = events[2][1]["details"]
    assert cut == {"run_id": "run-1", "reason": "files", "reported": 1, "left": 4, "bounds": OUTPUT_BOUNDS}
