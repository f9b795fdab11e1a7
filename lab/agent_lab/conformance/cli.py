"""`agent-driver controlplane conformance`: check a control plane against PROTOCOL.md from the driver's side.

    agent-driver controlplane conformance --url ws://127.0.0.1:8765/driver --token-file cp.token \\
        --instance drv-conformance [--api http://127.0.0.1:8766/api] [--timeout 5] [--no-liveness]

One line per rule (PASS / FAIL / SKIP and what was seen); exit status 1 when a rule fails, 2 for a
usage error. The kit speaks to the control plane as a driver would, under the instance id you give
(the token must allow it); it leaves its probe events (`diagnostic.reported`, code conformance.probe)
and `turn.cancel` commands in that instance's history. docs/conformance.md lists the rules.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from agent_lab.conformance.api import Api
from agent_lab.conformance.kit import Config, Kit


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="agent-driver controlplane conformance", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="the control plane's driver link (ws:// or wss://)")
    p.add_argument("--token-file", required=True, type=Path, help="a file holding the bearer token a driver uses")
    p.add_argument("--instance", required=True, help="the instance id to play (the token must allow it)")
    p.add_argument(
        "--api",
        help="base URL of the reference CP's HTTP routes (commands and read-back), e.g. http://127.0.0.1:8766/api",
    )
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for each answer (default 5)")
    p.add_argument(
        "--no-liveness", action="store_true", help="skip the silent-driver check (it takes ~4 heartbeat intervals)"
    )
    args = p.parse_args(argv)
    if not args.url.startswith(("ws://", "wss://")):
        p.error(f"--url must be ws:// or wss:// (got {args.url.split(':', 1)[0]}://...)")
    try:
        token = args.token_file.read_text().strip()
    except OSError as exc:
        p.error(f"--token-file {args.token_file}: {exc.strerror}")
    if not token:
        p.error(f"--token-file {args.token_file} is empty")
    cfg = Config(
        url=args.url,
        token=token,
        instance=args.instance,
        api=Api(args.api, token) if args.api else None,
        timeout=args.timeout,
        liveness=not args.no_liveness,
    )
    try:
        verdicts = asyncio.run(Kit(cfg).run())
    except OSError as exc:
        print(f"agent-driver controlplane conformance: cannot reach {args.url}: {exc}", file=sys.stderr)
        return 2
    for v in verdicts:
        print(v.line(), flush=True)
    failed = [v for v in verdicts if v.outcome == "FAIL"]
    passed = sum(v.outcome == "PASS" for v in verdicts)
    skipped = sum(v.outcome == "SKIP" for v in verdicts)
    print(f"{passed} passed, {len(failed)} failed, {skipped} skipped")
    return 1 if failed else 0
