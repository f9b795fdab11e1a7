"""`agent-driver run | dev | evidence | controlplane | bench | schema`: the command line."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import argparse

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
EX_TEMPFAIL = 75  # as for 4409: another process owns this instance's state_dir
EX_SOFTWARE = 70  # an internal error escaped every unit (the journal keeps what was not sent)


class RunArgs(NamedTuple):
    boot_file: str | None = None
    log_level: str = "info"
    handover: bool = False  # take the state_dir over from its running driver (driver/keeper/handover.py)


def _run_args(argv: list[str]) -> RunArgs | None:
    """`run [--boot-file F] [--log-level L]` read without argparse, whose import (with gettext) is
    ~3 ms of every sandbox's start; None for anything else, which argparse then reads (and refuses
    with its usual message)."""
    if not argv or argv[0] != "run":
        return None
    values = {"--boot-file": None, "--log-level": "info"}
    rest = argv[1:]
    handover = False
    while rest:
        flag, _, inline = rest.pop(0).partition("=")
        if flag == "--handover" and not inline:
            handover = True
            continue
        if flag not in values or (not inline and not rest):
            return None
        values[flag] = inline or rest.pop(0)
    if values["--log-level"] not in LOG_LEVELS:
        return None  # argparse names the bad level and the choices
    return RunArgs(values["--boot-file"], values["--log-level"] or "info", handover)


def _run(args: RunArgs | argparse.Namespace) -> int:
    t0 = time.monotonic()
    import gc

    # No cycle collection while the start allocates (imports, the journal, the dial): the kernel
    # freezes what the start built and turns the collector back on once its rooms are up.
    gc.disable()
    from driver.containment import make_undumpable

    # First, before the payload (and its token) is in memory: same-uid processes (the agent's tools)
    # must not read /proc/<driver>/mem or environ, nor ptrace the driver.
    make_undumpable()
    from driver import boot as boot_mod
    from driver import logs

    logs.configure(args.log_level, uplink=True)
    try:
        boot_path = boot_mod.resolve_boot_path(args.boot_file)
        payload = boot_mod.read_boot_payload(boot_path)
    except boot_mod.BootError as exc:
        print(f"agent-driver: {exc}", file=sys.stderr)
        return exc.exit_code
    from driver.net.link import TransportRefused, check_transport

    try:
        check_transport(payload.control)
    except TransportRefused as exc:
        print(f"agent-driver: boot: invalid payload: {exc}; {boot_mod.MINT_AGAIN}", file=sys.stderr)
        return boot_mod.EX_CONFIG
    logs.add(_secrets(payload))
    from pathlib import Path

    from driver.containment import statelock

    # Before anything else under state_dir is touched (the journal increments the epoch): PROTOCOL §8.
    from driver.queue.rowmac import RowMac, derive_key

    # The journal's key (pure, from the payload): the lock's record is authenticated with it too.
    row_mac = RowMac(derive_key(payload.control.token, payload.driver_instance_id))
    try:
        if getattr(args, "handover", False):
            from driver.keeper.handover import take_over

            lock = take_over(Path(payload.session.state_dir), mac=row_mac)
        else:
            lock = statelock.acquire(Path(payload.session.state_dir), row_mac)
    except statelock.StateDirLocked as exc:
        print(f"agent-driver: {exc}", file=sys.stderr)
        return EX_TEMPFAIL
    from driver import containment

    # What a previous process for this state_dir left behind dies before our own provider starts.
    containment.track(Path(payload.session.state_dir), row_mac)
    from driver.keeper import state as keeper_state

    keeper_state.use_mac(row_mac)  # the keeper's record and turn files are authenticated the same way
    keeper_state.use_payload(payload)  # a kept provider is adopted only under the payload that configured it
    from driver.containment import private_paths

    containment.hide(*private_paths(payload, Path(boot_path)))
    import anyio

    from driver.kernel.core import Kernel

    try:
        try:
            kernel = Kernel(payload, started_at=t0)
        except ValueError as exc:
            print(f"agent-driver: boot: invalid payload: {exc}; {boot_mod.MINT_AGAIN}", file=sys.stderr)
            return boot_mod.EX_CONFIG
        status = anyio.run(kernel.serve)
        if kernel.left_journaled:
            print(_left_journaled(kernel), file=sys.stderr)
        return status
    except Exception as exc:
        # The last line of the supervision boundary (driver.guard): whatever escaped every unit
        # ends the process with the README's 70 (the journal keeps what was not sent), never exit 1
        # with a bare traceback. Logged (redacted, with its traceback) for the operator.
        logs.get("driver").critical(
            "driver.internal_error", unit="process", error_type=type(exc).__name__, exc_info=True
        )
        print(f"agent-driver: internal error ({type(exc).__name__}); exiting 70", file=sys.stderr)
        return EX_SOFTWARE
    finally:
        lock.release()


def _left_journaled(kernel: Any) -> str:
    """The last line of a stop that could not deliver everything (exit 70): how many, why, what next."""
    link = kernel.link
    n = kernel.left_journaled
    if link is None or link.is_open:
        why = "the control plane did not store them within the drain bound"
    elif link.dials.ever_open:
        why = f"the link to {link.dials.url} was lost"
    else:
        why = f"the control plane at {link.dials.url} was never reached"
    return (
        f"agent-driver: stopped with {n} lossless event{'s' if n != 1 else ''} still journaled ({why}); "
        "a driver started on the same state_dir sends them; exiting 70"
    )


def _secrets(payload: Any) -> list[str]:
    """What the one redactor masks from the start (PROTOCOL §9): the control token, every value of
    `execution.environment`, and every header value an MCP server or the OTLP exporter is given."""
    env = payload.execution.environment
    found = [payload.control.token, *env.values()]
    header_vars = [v for server in payload.execution.mcp_servers for v in server.headers_from_env.values()]
    if payload.telemetry is not None:
        header_vars += payload.telemetry.headers_from_env.values()
    found += [env[v] for v in header_vars if v in env]
    return found


def _lab_module(name: str) -> Any:
    """A module of the laboratory (control plane, evidence, dev chat): a separate distribution that a
    sandbox image does not carry. Imported by name, so the daemon has no arrow into the lab."""
    import importlib

    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not exc.name.startswith("agent_lab"):
            raise
        print(
            f"agent-driver: {name.split('.')[1]} is part of the laboratory: pip install agent-driver-lab "
            "(from a checkout: pip install ./lab)",
            file=sys.stderr,
        )
        return None


def _schema(out: str | None) -> int:
    """`agent-driver schema [--out DIR]`: generated from driver/protocol/ (imported here, never at start)."""
    from pathlib import Path

    from driver.protocol.schema import documents, render

    docs = documents()
    if out is None:
        import json

        print(render({name: json.loads(render(doc)) for name, doc in docs.items()}), end="")
        return 0
    Path(out).mkdir(parents=True, exist_ok=True)
    for name, doc in docs.items():
        (Path(out) / name).write_text(render(doc))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    fast = _run_args(argv)
    if fast is not None:
        return _run(fast)
    import argparse

    from driver import __version__

    parser = argparse.ArgumentParser(prog="agent-driver", description=__doc__)
    parser.add_argument("-V", "--version", action="version", version=f"agent-driver {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{run,dev,evidence,controlplane,bench,schema}")
    run = sub.add_parser("run", help="run the driver (the sandbox entrypoint)")
    run.add_argument("--boot-file", help="path of the one-time boot payload (or AGENT_DRIVER_BOOT_FILE)")
    run.add_argument("--log-level", default="info", choices=LOG_LEVELS)
    run.add_argument(
        "--handover",
        action="store_true",
        help="take the state_dir over from the driver running on it: it hands its kept provider over and exits",
    )
    dev = sub.add_parser("dev", help="the driver with an embedded reference control plane and a terminal chat")
    dev.add_argument("--runtime", default="claude-agent-sdk", choices=["claude-agent-sdk", "openai-app-server", "acp"])
    dev.add_argument("--workdir", default=None, help="where the session lives (default: ./.dev)")
    dev.add_argument("--once", metavar="TEXT", default=None, help="send one input, print the reply, stop, exit")
    sub.add_parser("evidence", help="measure the five claims (resume, startup, ...) and report", add_help=False)
    sub.add_parser("controlplane", help="the reference control plane", add_help=False)
    sub.add_parser("bench", help="run the benchmarks", add_help=False)
    schema = sub.add_parser("schema", help="print the JSON Schemas of the boot payload, frames, commands, events")
    schema.add_argument("--out", metavar="DIR", help="write one file per part into DIR (the repo's schemas/)")
    if argv and argv[0].startswith("-") and argv[0] not in ("-h", "--help", "-V", "--version"):
        # argparse would first say a command is required; the flag itself is the problem.
        parser.error(f"unrecognized arguments: {argv[0]}")
    if argv and argv[0] in ("controlplane", "evidence"):
        lab = _lab_module(f"agent_lab.{argv[0]}.cli")
        if lab is None:
            return 2
        return int(lab.main(argv[1:]))
    if argv and argv[0] == "bench":
        bench = _lab_module("agent_lab.bench.__main__")
        if bench is None:
            return 2
        return int(bench.main(argv[1:]))
    args = parser.parse_args(argv)
    if args.command == "run":
        return _run(args)
    if args.command == "dev":
        dev_mod = _lab_module("agent_lab.dev")
        if dev_mod is None:
            return 2
        return int(dev_mod.main(args))
    if args.command == "schema":
        return _schema(args.out)
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
