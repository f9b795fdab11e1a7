"""Claude pieces without the CLI: a permission prompt's request and answer, and a turn's outcome."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from driver.adapters.claude import outcome as claude_outcome
from driver.adapters.claude import permissions as claude_permissions
from driver.adapters.claude.turn import TurnTranslator
from driver.interfaces import PermissionDecision


def test_host_tools_are_never_asked_about_locally() -> None:
    assert not claude_permissions.asks("mcp__host__deploy")
    assert claude_permissions.asks("Bash") and claude_permissions.asks("mcp__docs__search")


def test_the_request_names_the_call_and_says_what_it_does() -> None:
    request = claude_permissions.request_of("t1", "Bash", {"command": "ls"}, display_name=None, detail="List files")
    assert (request.tool_call_id, request.title, request.tool_name) == ("t1", "Bash: List files", "Bash")
    assert [o.kind for o in request.options] == ["allow_once", "allow_always", "reject_once"]
    # A detail that only repeats the label is not said twice.
    assert claude_permissions.request_of("t2", "Bash", {}, display_name="Shell", detail="Shell").title == "Shell"


def test_answers_keep_suggestions_only_for_always_and_mark_refusals() -> None:
    suggestions: list[Any] = [{"type": "addRules"}]
    once = claude_permissions.answer_of(PermissionDecision("allowed", "allow_once", "allow_once"), suggestions)
    always = claude_permissions.answer_of(PermissionDecision("allowed", "allow_always", "allow_always"), suggestions)
    assert once == claude_permissions.Answer(True) and always.updated_permissions == suggestions
    cancelled = claude_permissions.answer_of(PermissionDecision("cancelled", None), suggestions)
    assert (cancelled.allow, cancelled.interrupt, cancelled.refused) == (False, True, "cancelled")
    for outcome in ("rejected", "timed_out"):
        denied = claude_permissions.answer_of(PermissionDecision(outcome, None), None)  # type: ignore[arg-type]
        assert (denied.allow, denied.interrupt, denied.refused) == (False, False, "declined") and denied.message


def _result(**kw: Any) -> Any:
    fields: dict[str, Any] = {
        "terminal_reason": None,
        "is_error": False,
        "errors": None,
        "result": "",
        "subtype": "success",
        "api_error_status": None,
        "stop_reason": None,
    }
    return SimpleNamespace(**{**fields, **kw})


def test_turn_outcomes_cancel_then_model_errors_then_completion() -> None:
    translator = TurnTranslator("run-1", set(), {}, "/w")
    usage = {"cost_usd": 0.5}

    def outcome(result: Any, cancelling: bool = False) -> Any:
        return claude_outcome.turn_outcome(result, translator, usage, cancelling=cancelling, redact=str.upper)

    assert outcome(_result(), cancelling=True).status == "cancelled"
    assert outcome(_result(terminal_reason="aborted_streaming")).status == "cancelled"
    overloaded = outcome(_result(is_error=True, errors=["overloaded"], api_error_status=529))
    assert (overloaded.error_code, overloaded.error_message, overloaded.error_retryable) == (
        "provider.model_error",
        "OVERLOADED",  # through the redactor
        True,
    )
    assert outcome(_result(is_error=True, api_error_status=400, result="bad")).error_retryable is False
    done = outcome(_result())
    assert (done.status, done.stop_reason, done.usage) == ("completed", "end_turn", usage)


def test_a_runs_cost_is_its_share_of_the_running_total() -> None:
    assert claude_outcome.cost_share(0.75, 0.5) == 0.25
    assert claude_outcome.cost_share(0.1, 0.5) == 0.1  # a new CLI counts from zero again
