"""Each claim's check can fail: fed a broken history, the report says FAILED and the command's exit
status is non-zero (issue 10). The checks are pure, so the histories are plain lists here."""

from __future__ import annotations

from typing import Any

import pytest
from agent_lab.evidence import checks
from agent_lab.evidence.render import markdown
from agent_lab.evidence.report import Case, Claim, Report, judged, not_measured
from agent_lab.evidence.resume import EXPECTED

INSTANCE = "drv-t"
TOKEN = "evidence-ctl-0123456789abcdef"


def ev(seq: int, kind: str, run_id: str | None = "run-1", epoch: int = 1, **payload: Any) -> dict[str, Any]:
    return {
        "event_id": f"{INSTANCE}/{epoch}/{seq:06d}",
        "seq": seq,
        "epoch": epoch,
        "kind": kind,
        "delivery": "best_effort" if kind.endswith(".delta") else "lossless",
        "run_id": run_id,
        "payload": payload,
    }


def history() -> list[dict[str, Any]]:
    return [
        ev(1, "driver.started", None),
        ev(2, "run.started", run_id="run-1"),
        ev(3, "message.started", message_id="m1", role="assistant"),
        ev(4, "message.delta", message_id="m1", text="hi"),
        ev(5, "message.completed", message_id="m1", role="assistant", text="hi"),
        ev(6, "tool.started", tool_call_id="t1"),
        ev(7, "tool.completed", tool_call_id="t1", status="completed"),
        ev(8, "run.completed"),
    ]


def report_of(case: Case, claim: str = "events") -> Report:
    return Report(offline=True, conditions={}, claims=[Claim(claim, "acp", [case])])


def test_an_intact_history_passes() -> None:
    h = history()
    acc = checks.account(h, h)
    assert acc.lost == [] and acc.duplicated == []
    assert acc.measured()["lossless_stored"] == 7
    rep = report_of(judged("link cut", acc.measured(), acc.failures()))
    assert rep.verdict == "passed" and rep.exit_status() == 0


def test_a_stored_event_removed_fails_the_claim() -> None:
    received = history()
    stored = [e for e in received if e["seq"] != 6]  # tool.started received, then lost by the store
    acc = checks.account(received, stored)
    assert acc.measured()["lossless_lost"] == 1
    rep = report_of(judged("link cut", acc.measured(), acc.failures()))
    assert rep.verdict == "failed" and rep.exit_status() == 1
    assert "**FAILED**" in markdown(rep)
    assert rep.as_json()["claims"][0]["verdict"] == "failed"


def test_a_lost_event_the_tap_never_saw_is_a_hole_in_the_run() -> None:
    stored = [e for e in history() if e["kind"] != "message.completed"]
    acc = checks.account(stored, stored)
    assert any("message.completed of m1" in x for x in acc.lost)
    no_terminal = [e for e in history() if e["kind"] != "run.completed"]
    assert checks.account(no_terminal, no_terminal).lost == ["run-1: terminal"]
    # ... unless the run's sandbox died under it (the CP closes that run).
    assert checks.account(no_terminal, no_terminal, open_runs_ok={"run-1"}).lost == []


@pytest.mark.parametrize(
    "twice",
    [
        pytest.param(lambda h: h[4], id="same event id"),
        pytest.param(lambda h: {**h[4], "event_id": f"{INSTANCE}/2/000005"}, id="same seq, other id"),
        pytest.param(lambda h: {**h[7], "seq": 9, "event_id": f"{INSTANCE}/1/000009"}, id="a second terminal"),
    ],
)
def test_an_event_stored_twice_fails_the_claim(twice: Any) -> None:
    h = history()
    stored = [*h, twice(h)]
    acc = checks.account(h, stored)
    assert acc.measured()["lossless_duplicated"] >= 1
    rep = report_of(judged("receipts duplicated", acc.measured(), acc.failures()))
    assert rep.verdict == "failed" and rep.exit_status() == 1


def test_flood_steps_with_a_hole_or_a_repeat_fail() -> None:
    def step(seq: int, n: int) -> dict[str, Any]:
        return ev(seq, "plan.updated", entries=[{"content": f"step {n}", "status": "pending"}])

    good = [ev(1, "run.started"), step(2, 0), step(3, 1), ev(4, "run.failed", error={"code": "driver.restarted"})]
    assert checks.account(good, good).failures() == []
    holed = [good[0], good[2], good[3]]
    assert checks.account(holed, holed).lost == ["run-1 step 0 (hole)"]
    repeated = [*good[:3], step(5, 1), good[3]]
    assert checks.account(repeated, repeated).duplicated == ["run-1 step 1"]


def test_a_provider_process_left_alive_fails_resume() -> None:
    measured = {
        "run_in_flight": "run.failed{driver.restarted}",
        "native_session": "resumed",
        "files_kept": True,
        "memory_kept": True,
        "provider_processes_left": 0,
    }
    assert checks.judge_resume(measured, EXPECTED["driver killed"]) == []
    measured["provider_processes_left"] = 1
    failures = checks.judge_resume(measured, EXPECTED["driver killed"])
    assert failures == ["provider_processes_left = 1, expected 0"]
    rep = report_of(judged("driver killed", measured, failures), claim="resume")
    assert rep.verdict == "failed" and rep.exit_status() == 1
    assert checks.judge_processes_gone([{"pid": 7, "argv0": "codex"}], "provider") != []


def test_native_session_and_run_outcome_are_named_from_observations() -> None:
    assert checks.native_session(False, True) == "resumed"
    assert checks.native_session(True, True) == "reset+replayed"
    assert checks.native_session(False, False) == "lost"
    assert checks.native_session(False, None) == "unknown"
    assert checks.run_outcome(None) == "open"
    assert checks.run_outcome(ev(9, "run.failed", error={"code": "provider.crashed"})) == "run.failed{provider.crashed}"


def test_a_token_in_a_childs_environment_fails_isolation() -> None:
    places: dict[str, bytes | str | None] = {
        "environ of 12 codex": b"PATH=/bin\0OPENAI_API_KEY=sk\0",
        "agent tool read of mem": None,
        "driver log": "nothing here",
    }
    clean = checks.token_findings(places, TOKEN)
    assert clean == {"environ of 12 codex": "absent", "agent tool read of mem": "unreadable", "driver log": "absent"}
    assert checks.judge_token(clean) == []
    places["environ of 12 codex"] = f"PATH=/bin\0LEAK={TOKEN}\0".encode()
    findings = checks.token_findings(places, TOKEN)
    failures = checks.judge_token(findings)
    assert failures == ["the control token was found in environ of 12 codex"]
    rep = report_of(judged("credential: control token", {}, failures), claim="isolation")
    assert rep.verdict == "failed" and rep.exit_status() == 1


def test_run_cancelled_without_side_effects_fails_cancellation() -> None:
    assert checks.judge_side_effects(None, [], []) == ["no run.cancelled stored"]
    bare = {"reason": "user", "details": {"phase": "interrupt"}}
    assert len(checks.judge_side_effects(bare, ["a.txt"], [])) == 2
    full = {
        "tool_calls": [{"tool_call_id": "t1", "status": "cancelled"}],
        "side_effects": {"files_changed": [{"path": "a.txt", "change": "created"}], "processes_left": []},
    }
    assert checks.judge_side_effects(full, ["a.txt"], []) == []
    assert checks.judge_side_effects(full, ["a.txt", "b.txt"], [41]) == [
        "side_effects.files_changed misses b.txt",
        "side_effects.processes_left misses pids [41]",
    ]


def test_verdicts_combine_and_not_measured_is_listed_not_passed() -> None:
    only_nm = Report(True, {}, [Claim("isolation", "acp", [not_measured("network", "not enforced")])])
    assert only_nm.verdict == "not_measured" and only_nm.exit_status() == 0
    data = only_nm.as_json()
    assert data["claims"][0]["reason"] == "not enforced"
    assert data["not_measured"] == ["isolation/acp/network: not enforced"]
    mixed = Claim("startup", "acp", [judged("a", {}, []), not_measured("b", "why")])
    assert mixed.verdict == "passed"
    mixed.cases.append(judged("c", {}, ["broken"]))
    assert mixed.verdict == "failed"
    with pytest.raises(ValueError, match="unknown claim"):
        Claim("speed", "acp")


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert checks.summary_ms(values) == {"n": 100, "p50_ms": 50.0, "p95_ms": 95.0, "p99_ms": 99.0}
    assert checks.summary_ms([])["p50_ms"] is None
    assert checks.percentile([3.0], 99) == 3.0


def test_bench_goal_lines_reach_the_report() -> None:
    from agent_lab.evidence.performance import parse

    out = 'table\n  goal x: NOT met (2 x)\nBENCH-GOAL {"goal": "x", "met": false, "measured": "2 x"}\n'
    goals = parse(out, "cold_start")
    assert goals == [{"bench": "cold_start", "goal": "x", "met": False, "measured": "2 x"}]
    rep = Report(True, {}, [Claim("startup", "acp", [judged("a", {}, [])])], performance=goals)
    assert "| cold_start | x | **NOT met** | 2 x |" in markdown(rep)
    assert rep.as_json()["performance"] == goals


def test_the_markdown_opens_with_a_summary_per_claim_and_runtime() -> None:
    rep = Report(
        True,
        {"cpus": 2},
        [
            Claim("resume", "acp", [judged("link lost", {"lossless_lost": 0}, [])]),
            Claim("resume", "claude-agent-sdk", [judged("driver killed", {}, ["provider left"])]),
        ],
    )
    text = markdown(rep)
    assert "| claim | acp | claude-agent-sdk |" in text
    assert "| resume | passed | **FAILED** |" in text
    assert "| driver killed | **FAILED** | - |  | provider left |" in text


@pytest.mark.parametrize(
    ("argv", "named"),
    [(["--runs", "0"], "--runs"), (["--runtime", "gemini"], "--runtime"), (["--claim", "speed"], "--claim")],
)
def test_bad_arguments_are_named(argv: list[str], named: str, capsys: pytest.CaptureFixture[str]) -> None:
    from agent_lab.evidence.cli import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert named in capsys.readouterr().err


def test_a_hole_inside_an_epoch_breaks_the_durable_prefix() -> None:
    """PROTOCOL §4.1: a newer step of an epoch stored without an older one of the same epoch fails, even
    when a later epoch filled the step in (the run's steps then look whole)."""

    def step(seq: int, n: int, epoch: int = 1) -> dict[str, Any]:
        return ev(seq, "plan.updated", epoch=epoch, entries=[{"content": f"step {n}", "status": "pending"}])

    good = [ev(1, "run.started"), step(2, 0), step(3, 1), step(4, 2)]
    acc = checks.account(good, good)
    assert acc.prefix_holes == [] and acc.measured()["durable_prefix_per_epoch"] is True
    holed = [good[0], good[1], good[3], step(9, 1, epoch=2)]
    acc = checks.account(holed, holed)
    assert acc.prefix_holes == ["run-1 epoch 1 steps [1]"]
    assert acc.measured()["durable_prefix_per_epoch"] is False
    assert any("not a prefix" in f for f in acc.failures())


def test_the_unjournaled_bound_counts_the_window_and_the_pipe() -> None:
    bound = checks.unjournaled_bound(1000.0, 4 * 1024 * 1024, 128 * 1024, 300)
    assert bound == 4194 + 436 + 1
    assert checks.unjournaled_bound(0.0, 10, 10, 0) == 10 + 10 + 1  # never a division by zero


def test_driver_killed_with_reattach_must_continue_the_run() -> None:
    measured = {
        "run_in_flight": "run.completed",
        "native_session": "resumed",
        "files_kept": True,
        "memory_kept": True,
        "text_whole": True,
        "same_provider": True,
        "model_requests_during_reattach": 0,
    }
    assert checks.judge_resume(measured, EXPECTED["driver killed (reattach)"]) == []
    restarted = measured | {"run_in_flight": "run.failed{driver.restarted}", "model_requests_during_reattach": 1}
    failures = checks.judge_resume(restarted, EXPECTED["driver killed (reattach)"])
    assert len(failures) == 2 and "run_in_flight" in failures[0]
