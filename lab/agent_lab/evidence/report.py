"""The evidence report as data: cases, claims, verdicts and the JSON shape (no I/O).

A verdict is `passed`, `failed` or `not_measured` (with a reason). A claim fails when any of its cases
failed; a `not_measured` case is listed, never counted as passed. The top verdict is `failed` when any
claim or case failed, `passed` when at least one case passed and none failed, else `not_measured`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Verdict = Literal["passed", "failed", "not_measured"]
CLAIMS = ("resume", "startup", "events", "isolation", "cancellation")
RUNTIMES = ("claude-agent-sdk", "openai-app-server", "acp")


@dataclass
class Case:
    name: str
    verdict: Verdict
    measured: dict[str, Any] = field(default_factory=dict)
    reason: str | None = None  # why it failed or was not measured
    done: str = ""  # what was done, in one line

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "verdict": self.verdict, "measured": self.measured}
        if self.done:
            out["done"] = self.done
        if self.reason is not None:
            out["reason"] = self.reason
        return out


def judged(name: str, measured: dict[str, Any], failures: list[str], done: str = "") -> Case:
    """A case that passed when `failures` is empty, else failed with the failures as its reason."""
    if failures:
        return Case(name, "failed", measured, "; ".join(failures), done)
    return Case(name, "passed", measured, None, done)


def not_measured(name: str, reason: str, measured: dict[str, Any] | None = None, done: str = "") -> Case:
    return Case(name, "not_measured", measured or {}, reason, done)


def combine(verdicts: list[Verdict]) -> Verdict:
    if "failed" in verdicts:
        return "failed"
    if "passed" in verdicts:
        return "passed"
    return "not_measured"


@dataclass
class Claim:
    claim: str
    runtime: str
    cases: list[Case] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what is not enforced, conditions of this claim

    def __post_init__(self) -> None:
        if self.claim not in CLAIMS:
            raise ValueError(f"unknown claim {self.claim!r}; one of {', '.join(CLAIMS)}")

    @property
    def verdict(self) -> Verdict:
        return combine([c.verdict for c in self.cases])

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "claim": self.claim,
            "runtime": self.runtime,
            "verdict": self.verdict,
            "cases": [c.as_json() for c in self.cases],
        }
        if self.verdict == "not_measured":
            out["reason"] = "; ".join(c.reason or "" for c in self.cases if c.reason) or "nothing was measured"
        if self.notes:
            out["notes"] = self.notes
        return out


@dataclass
class Report:
    offline: bool
    conditions: dict[str, Any]
    claims: list[Claim] = field(default_factory=list)
    performance: list[dict[str, Any]] = field(default_factory=list)  # the restated goals, when measured
    elapsed_s: float = 0.0

    @property
    def verdict(self) -> Verdict:
        return combine([c.verdict for c in self.claims])

    def failures(self) -> list[str]:
        return [
            f"{cl.claim}/{cl.runtime}/{c.name}: {c.reason}"
            for cl in self.claims
            for c in cl.cases
            if c.verdict == "failed"
        ]

    def as_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "offline": self.offline,
            "conditions": self.conditions,
            "claims": [c.as_json() for c in self.claims],
            "not_measured": [
                f"{cl.claim}/{cl.runtime}/{c.name}: {c.reason}"
                for cl in self.claims
                for c in cl.cases
                if c.verdict == "not_measured"
            ],
            "performance": self.performance,
            "elapsed_s": round(self.elapsed_s, 1),
        }

    def exit_status(self) -> int:
        return 1 if self.verdict == "failed" else 0
