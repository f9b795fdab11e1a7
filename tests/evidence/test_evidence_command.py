"""`agent-driver evidence --quick --runtime acp` end to end: the real driver, codex-acp against the
fake Responses endpoint, the reference control plane. Claims may fail until their features land; this
asserts the report's shape, that every verdict agrees with its cases, and that the exit status
agrees with the top verdict."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from agent_lab.evidence.report import CLAIMS

ROOT = Path(__file__).resolve().parents[2]
VERDICTS = {"passed", "failed", "not_measured"}
RESUME_CASES = [
    "link lost",
    "provider killed",
    "driver killed",
    "driver killed (reattach)",  # not_measured for acp: it declares reattach unsupported
    "sandbox lost (cattle)",
    "sandbox lost (pet, memory_dir kept)",
]


def _ms_fields(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [v for k, v in value.items() if k.endswith("_ms")] + [x for v in value.values() for x in _ms_fields(v)]
    if isinstance(value, list):
        return [x for v in value for x in _ms_fields(v)]
    return []


@pytest.mark.provider
@pytest.mark.serial  # its 3-minute budget is measured
@pytest.mark.timeout(300)  # its own budget is asserted below (180 s); the suite's 120 s cut it short
def test_quick_evidence_for_acp(tmp_path: Path) -> None:
    out, md = tmp_path / "evidence.json", tmp_path / "evidence.md"
    t0 = time.monotonic()
    command = [sys.executable, "-m", "driver.cli", "evidence", "--quick", "--runtime", "acp"]
    proc = subprocess.run(
        [*command, "--json", str(out), "--markdown", str(md)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    elapsed = time.monotonic() - t0
    assert elapsed < 180, f"--quick for one runtime took {elapsed:.0f} s (the budget is 3 minutes)"
    report = json.loads(out.read_text())
    assert report["verdict"] in VERDICTS
    assert report["offline"] is True
    cond = report["conditions"]
    assert cond["cpus"] >= 1 and cond["python"].count(".") == 2
    assert cond["runtimes"]["acp"].startswith("codex-acp ")
    assert [c["claim"] for c in report["claims"]] == list(CLAIMS)
    any_failed = False
    for claim in report["claims"]:
        assert claim["runtime"] == "acp"
        verdicts = [case["verdict"] for case in claim["cases"]]
        assert verdicts and set(verdicts) <= VERDICTS
        for case in claim["cases"]:
            assert isinstance(case["name"], str) and isinstance(case["measured"], dict)
            if case["verdict"] != "passed":
                assert case["reason"], case
        expected = "failed" if "failed" in verdicts else ("passed" if "passed" in verdicts else "not_measured")
        assert claim["verdict"] == expected, claim
        any_failed |= expected == "failed"
    assert report["verdict"] == ("failed" if any_failed else "passed")
    assert proc.returncode == (1 if any_failed else 0), proc.stderr[-2000:]
    assert all(isinstance(v, int | float) for v in _ms_fields(report["claims"]) if v is not None)
    resume = next(c for c in report["claims"] if c["claim"] == "resume")
    assert [c["name"] for c in resume["cases"]] == RESUME_CASES
    wanted = {"lossless_lost", "lossless_duplicated", "run_in_flight", "native_session", "files_kept"}
    for case in resume["cases"]:
        if case["measured"]:
            assert wanted <= set(case["measured"]), case
    events = next(c for c in report["claims"] if c["claim"] == "events")
    flood = next(c for c in events["cases"] if c["name"].startswith("SIGKILL inside the group-commit window"))
    assert "lost_unjournaled" in flood["measured"] and flood["measured"]["lossless_lost"] == 0
    text = md.read_text()
    assert text.startswith("# agent-driver evidence") and "## resume — acp" in text
    # The failures are named on stderr, one line each.
    failed_cases = [c for cl in report["claims"] for c in cl["cases"] if c["verdict"] == "failed"]
    assert proc.stderr.count("FAILED ") == len(failed_cases)
