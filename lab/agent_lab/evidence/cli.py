"""`agent-driver evidence`: run the five claims through the real driver, provider runtimes and the
reference control plane, print the report, write it as JSON / Markdown, exit 1 when a claim failed."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from pathlib import Path

from agent_lab.evidence.report import CLAIMS, RUNTIMES, Claim, Report

Collector = Callable[..., Awaitable[Claim]]


def _collectors() -> dict[str, Collector]:
    from agent_lab.evidence import cancellation, events, isolation, resume, startup

    return {
        "resume": resume.collect,
        "startup": startup.collect,
        "events": events.collect,
        "isolation": isolation.collect,
        "cancellation": cancellation.collect,
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runtime", action="append", choices=RUNTIMES, help="repeatable; default: all three")
    parser.add_argument("--claim", action="append", choices=CLAIMS, help="repeatable; default: all five")
    parser.add_argument("--quick", action="store_true", help="fewer runs (startup 5, cancels 3): the CI mode")
    parser.add_argument("--runs", type=int, default=None, help="startup runs per mode (default 30, --quick 5)")
    parser.add_argument(
        "--bench",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also run the performance benchmarks (agent_lab.bench; default: on, off with --quick)",
    )
    parser.add_argument("--json", metavar="FILE", help="write the JSON report here")
    parser.add_argument("--markdown", metavar="FILE", help="write the Markdown report here")


async def run(args: argparse.Namespace) -> Report:
    import anyio

    from agent_lab.evidence import conditions
    from agent_lab.evidence.rig import project_root, rig
    from agent_lab.testing.fakes import Fakes

    runtimes = list(dict.fromkeys(args.runtime or RUNTIMES))  # a repeated --runtime runs once
    claims = [c for c in CLAIMS if c in (args.claim or CLAIMS)]  # the report keeps the claims' order
    runs = args.runs or (5 if args.quick else 30)
    report = Report(offline=True, conditions=conditions.collect(project_root(), runtimes, args.quick, runs))
    collectors = _collectors()
    t0 = time.monotonic()
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="agent-driver-evidence-") as tmp:
        fakes = Fakes(stack)
        for runtime in runtimes:
            for name in claims:
                root = Path(tmp) / f"{name}-{runtime}"
                root.mkdir()
                t = time.monotonic()
                async with rig(root, fakes) as r:
                    claim = await collectors[name](
                        r, runtime, quick=args.quick, runs=runs, first_runtime=runtime == runtimes[0]
                    )
                report.claims.append(claim)
                print(
                    f"  {name} / {runtime}: {claim.verdict} ({time.monotonic() - t:.0f} s)", file=sys.stderr, flush=True
                )
    if args.bench if args.bench is not None else not args.quick:
        from agent_lab.evidence import performance

        print("  performance goals (agent_lab.bench) ...", file=sys.stderr, flush=True)
        report.performance = await anyio.to_thread.run_sync(performance.collect)
    report.elapsed_s = time.monotonic() - t0
    return report


def main(argv: list[str]) -> int:
    import anyio

    from agent_lab.evidence.render import markdown
    from driver import logs

    parser = argparse.ArgumentParser(prog="agent-driver evidence", description=__doc__)
    add_arguments(parser)
    args = parser.parse_args(argv)
    if args.runs is not None and args.runs < 1:
        parser.error("--runs must be at least 1")
    logs.configure("error")
    logging.getLogger().setLevel(logging.ERROR)
    report = anyio.run(run, args)
    text = markdown(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report.as_json(), indent=2) + "\n")
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    print(text)
    for failure in report.failures():
        print(f"FAILED {failure}", file=sys.stderr)
    return report.exit_status()
