"""The report as Markdown: the verdict, the conditions, one table per claim with the measured values."""

from __future__ import annotations

import json
from typing import Any

from agent_lab.evidence.report import Report

_MARK = {"passed": "passed", "failed": "**FAILED**", "not_measured": "not measured"}


def _value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    text = json.dumps(v, separators=(", ", ": "), default=str) if isinstance(v, dict | list) else str(v)
    return text.replace("|", "\\|").replace("\n", " ")


def _measured(m: dict[str, Any]) -> str:
    return "; ".join(f"{k} = {_value(v)}" for k, v in m.items()) or "-"


def _summary(claims: list[dict[str, Any]]) -> list[str]:
    """One line per claim, one column per runtime: the verdicts at a glance."""
    runtimes = list(dict.fromkeys(c["runtime"] for c in claims))
    names = list(dict.fromkeys(c["claim"] for c in claims))
    verdict = {(c["claim"], c["runtime"]): c["verdict"] for c in claims}
    lines = ["## Summary", "", "| claim | " + " | ".join(runtimes) + " |", "| --- |" + " --- |" * len(runtimes)]
    for name in names:
        cells = [_MARK.get(verdict.get((name, r), ""), "-") for r in runtimes]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def markdown(report: Report) -> str:
    data = report.as_json()
    lines = [
        "# agent-driver evidence",
        "",
        f"Verdict: **{data['verdict'].upper()}**" + (" (offline: fake model endpoints)" if data["offline"] else ""),
        "",
        "## Conditions",
        "",
    ]
    lines += [f"- {k}: {_value(v)}" for k, v in data["conditions"].items()]
    lines += [f"- elapsed: {data['elapsed_s']} s", ""]
    lines += _summary(data["claims"])
    for claim in data["claims"]:
        lines += [f"## {claim['claim']} — {claim['runtime']}: {_MARK[claim['verdict']]}", ""]
        lines += ["| case | verdict | measured | what was done | why |", "| --- | --- | --- | --- | --- |"]
        for case in claim["cases"]:
            lines.append(
                f"| {case['name']} | {_MARK[case['verdict']]} | {_measured(case['measured'])} | "
                f"{_value(case.get('done', ''))} | {_value(case.get('reason') or '')} |"
            )
        lines += [""] + [f"- {_value(n)}" for n in claim.get("notes", [])] + [""]
    if data["performance"]:
        lines += [
            "## Performance goals (agent_lab.bench, same machine, same run)",
            "",
            "| bench | goal | met | measured |",
            "| --- | --- | --- | --- |",
        ]
        for p in data["performance"]:
            met = "met" if p.get("met") else "**NOT met**"
            lines.append(f"| {p.get('bench')} | {_value(p.get('goal'))} | {met} | {_value(p.get('measured'))} |")
        lines.append("")
    if data["not_measured"]:
        lines += ["## Not measured", ""] + [f"- {_value(n)}" for n in data["not_measured"]] + [""]
    return "\n".join(lines)
