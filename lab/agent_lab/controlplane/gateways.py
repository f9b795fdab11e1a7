"""`agent-driver controlplane gateways N --store postgresql://... --token-file F [serve options]`: N gateway
processes over one database, on one shared port (SO_REUSEPORT), each a `controlplane serve` of its own.

The token files are read (or created) here first, so N children do not race to create them. Every
gateway gets the same console token file (`--console-token-file`, default `console.token` beside the
token file): a console session cookie is an HMAC under the console token bound to the port, so with one
token on one shared port a cookie issued by one gateway is valid at every other, whichever gateway the
kernel hands the browser's next connection to. A lone `serve` without that file makes a random console
token per process and prints a one-time login link whose code lives in that process's memory: with N
gateways that would be N tokens (a cookie valid at one gateway only) and a link another gateway cannot
redeem, so gateways print no link: the operator logs in with the token in the file (docs/controlplane.md).
SIGINT/SIGTERM stop every child; a child that dies is reported and not restarted (a supervisor's job).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from agent_lab.controlplane.engine import is_postgres

PROG = "agent-driver controlplane gateways"


def gateway_argv(store: str, index: int, serve_args: list[str]) -> list[str]:
    """The command line of gateway `index` (1-based)."""
    return [
        sys.executable,
        "-m",
        "agent_lab.controlplane.cli",
        "serve",
        "--store",
        store,
        "--gateway-id",
        f"gw-{index}",
        "--reuse-port",
        *serve_args,
    ]


def _split(argv: list[str]) -> tuple[int, str, list[str]]:
    if not argv or not argv[0].isdigit() or int(argv[0]) < 1:
        raise SystemExit(f"usage: {PROG} N --store postgresql://... --token-file FILE [serve options]")
    count, rest = int(argv[0]), argv[1:]
    store = None
    out: list[str] = []
    i = 0
    while i < len(rest):
        arg = rest[i]
        if arg == "--store" and i + 1 < len(rest):
            store, i = rest[i + 1], i + 2
            continue
        if arg.startswith("--store="):
            store = arg.partition("=")[2]
        elif arg == "--db":
            raise SystemExit(f"{PROG}: gateways share a PostgreSQL database: give --store postgresql://...")
        else:
            out.append(arg)
        i += 1
    if store is None or not is_postgres(store):
        raise SystemExit(f"{PROG}: --store postgresql://... is required (SQLite serves one process only)")
    return count, store, out


def shared_token_files(serve_args: list[str]) -> list[str]:
    """The serve options with one console token file for every gateway; both token files exist after."""
    from agent_lab.controlplane.cli import read_or_create_token

    args = list(serve_args)
    if "--token-file" not in args or args.index("--token-file") + 1 >= len(args):
        raise SystemExit(f"{PROG}: --token-file FILE is required")
    token_file = Path(args[args.index("--token-file") + 1])
    read_or_create_token(token_file)
    if "--console-token-file" in args and args.index("--console-token-file") + 1 < len(args):
        console_file = Path(args[args.index("--console-token-file") + 1])
    else:
        console_file = token_file.with_name("console.token")
        args += ["--console-token-file", str(console_file)]
    read_or_create_token(console_file)
    return args


def main(argv: list[str]) -> int:
    count, store, serve_args = _split(argv)
    serve_args = shared_token_files(serve_args)
    children = [subprocess.Popen(gateway_argv(store, i, serve_args)) for i in range(1, count + 1)]
    stopping = False

    def stop(_sig: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    print(f"{PROG}: {count} gateways (pids {' '.join(str(c.pid) for c in children)})", file=sys.stderr, flush=True)
    while not stopping and any(c.poll() is None for c in children):
        time.sleep(0.2)  # a supervisor's poll of its children, not a wait for a test's condition
    for c in children:
        if c.poll() is None:
            c.send_signal(signal.SIGTERM)
    codes = [c.wait(timeout=30) for c in children]
    return 0 if stopping else max(codes)
