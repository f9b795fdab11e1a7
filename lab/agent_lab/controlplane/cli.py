"""`agent-driver controlplane ...`: run the reference control plane, or talk to its HTTP API.

agent-driver controlplane [serve] --db cp.db --token-file cp.token [--host 127.0.0.1] [--port 8765]
                          [--http-port 8766] [--instance ID ...] [--heartbeat-ms 5000]
                          [--http-host 127.0.0.1 --console-token-file console.token] [--artifacts ID=DIR ...]
    Serve ws://HOST:PORT/driver, and the HTTP API and the web console on http://HTTP_HOST:HTTP_PORT. The
    token file holds the bearer token (created with a random token, mode 0600, when missing). Without
    --instance the token may drive any instance id. The console needs its own token: the one in
    --console-token-file (created when missing), else a random one for this process, printed in the
    console's login URL. A non-loopback --http-host needs --console-token-file, and then every request
    on that port needs the console token. --artifacts names where an instance's cwd is readable here,
    so its artifacts can be downloaded.

agent-driver controlplane gateways N --store postgresql://... --token-file cp.token [serve options]
    Start N gateway processes over one PostgreSQL database, sharing --port and --http-port (SO_REUSEPORT:
    a driver that redials after a gateway died lands on a living one). Each serves the driver link, the
    HTTP API and the console; ownership, commands and events go through the database (docs/controlplane.md).

agent-driver controlplane send --url http://127.0.0.1:8766 --token-file cp.token --instance ID
                          --kind input.start [--run-id R] [--text "..."] [--field key=value ...]
                          [--json '{"...": ...}'] [--command-id ID]
    Queue a command (sent at once when the instance is connected). `--field` values are parsed as
    JSON when they parse, else taken as strings. For input.start, `--text` builds `input` and a run
    id is generated when none is given.

agent-driver controlplane events   --url ... --token-file ... --instance ID [--after-seq N] [--kind K]
                          [--wait SECONDS]
    With --wait: when nothing matches yet, wait up to SECONDS for a match (exit 1 if none came).
agent-driver controlplane commands --url ... --token-file ... --instance ID
agent-driver controlplane checkpoints --url ... --token-file ... --instance ID
    The instance's complete native checkpoints (PROTOCOL §8.1); `boot --resume-from ID` uses the last.
agent-driver controlplane faults   --url ... --token-file CONSOLE_TOKEN_FILE [--set knob=value ...] [--reset]
    The fault API takes the operator's token (the console's), never a driver's.
agent-driver controlplane terminate --url ... --token-file ... --instance ID
agent-driver controlplane conformance --url ws://HOST:PORT/driver --token-file F --instance ID [--api URL]
    Play a scripted driver against a control plane and report each PROTOCOL.md rule it breaks
    (lab/agent_lab/conformance/, docs/conformance.md).
agent-driver controlplane boot --runtime R --instance ID --out FILE --cwd DIR --state-dir DIR [...]
    Mint a one-time boot payload (mode 0600) pointing at the running control plane, with its token.
    See `agent-driver controlplane boot --help` and lab/agent_lab/controlplane/boot.py.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import json
import os
import secrets
import signal
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent_lab.controlplane.server import ControlPlane

import tenacity

from driver.protocol.commands import COMMAND_KINDS

CLIENT_COMMANDS = ("send", "events", "commands", "checkpoints", "faults", "terminate")


def main(argv: list[str]) -> int:
    if argv and argv[0] == "boot":
        from agent_lab.controlplane.boot import main as boot_main

        return boot_main(argv[1:])
    if argv and argv[0] == "conformance":
        from agent_lab.conformance.cli import main as conformance_main

        return conformance_main(argv[1:])
    if argv and argv[0] in CLIENT_COMMANDS:
        return _client(argv[0], argv[1:])
    if argv and argv[0] == "gateways":
        from agent_lab.controlplane.gateways import main as gateways_main

        return gateways_main(argv[1:])
    if argv and argv[0] == "serve":
        argv = argv[1:]
    return _serve(argv)


# -- server -------------------------------------------------------------------------------------


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """parse_args, but an unknown flag is named before any missing required one (argparse would only
    say that --db is required when the user mistyped --db)."""
    known = parser._option_string_actions
    for arg in argv:
        if arg == "--":
            break
        negative_number = arg[1:].replace(".", "", 1).isdigit()
        if arg.startswith("-") and not negative_number and arg.partition("=")[0] not in known:
            parser.error(f"unrecognized arguments: {arg}")
    return parser.parse_args(argv)


def read_or_create_token(path: Path) -> str:
    """The token in `path`; a fresh random one (file mode 0600) if the file does not exist."""
    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        token = secrets.token_urlsafe(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        print(f"wrote a new token to {path}", file=sys.stderr)
    if not token:
        raise SystemExit(f"token file {path} is empty")
    return token


def _serve(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="agent-driver controlplane",
        description="Run the reference control plane.",
        epilog="client commands (each with --help): " + ", ".join((*CLIENT_COMMANDS, "boot", "conformance")),
    )
    p.add_argument("--db", type=Path, help="SQLite database file (created when missing)")
    p.add_argument("--store", help="the store: a SQLite file, or a postgresql:// URL that N gateways share")
    p.add_argument("--gateway-id", default="gw-1", help="this gateway's name (several over one database)")
    p.add_argument("--reuse-port", action="store_true", help="share --port/--http-port with other gateways")
    p.add_argument("--token-file", required=True, type=Path)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--http-port", type=int, default=8766, help="HTTP API and console port (-1: neither)")
    p.add_argument("--http-host", default="127.0.0.1", help="HTTP host (not loopback: needs --console-token-file)")
    p.add_argument("--console-token-file", type=Path, help="the console's token (created when missing)")
    p.add_argument(
        "--artifacts", action="append", default=[], metavar="ID=DIR", help="instance ID's cwd, as seen from here"
    )
    p.add_argument("--instance", action="append", default=None, help="allowed instance id (repeatable)")
    p.add_argument("--heartbeat-ms", type=int, default=5000)
    p.add_argument("--tls-cert", type=Path, help="serve wss:// with this certificate chain (PEM)")
    p.add_argument("--tls-key", type=Path, help="private key for --tls-cert (PEM)")
    p.add_argument("--log-level", default="info")
    args = parse(p, argv)
    if (args.db is None) == (args.store is None):
        p.error("give the store: --db FILE (SQLite) or --store FILE|postgresql://...")

    from agent_lab.controlplane.console import is_loopback
    from driver.logs import REDACTOR, configure

    if not is_loopback(args.http_host) and args.console_token_file is None:
        print(
            f"agent-driver controlplane: --http-host {args.http_host} is not loopback; "
            "it needs --console-token-file (every request on that port then needs that token)",
            file=sys.stderr,
        )
        return 2
    if taken := _taken_ports(args):
        # Before anything is created or logged: the line is all a newcomer sees (a second control
        # plane). A port taken between this check and the listen is caught in _run_server too.
        print(f"agent-driver controlplane: {_in_use(*taken[0])}", file=sys.stderr)
        return 1
    artifact_roots = _artifact_roots(args.artifacts)
    token = read_or_create_token(args.token_file)
    console_token = (
        secrets.token_urlsafe(24) if args.console_token_file is None else read_or_create_token(args.console_token_file)
    )
    REDACTOR.add([token, console_token])
    configure(args.log_level)
    return asyncio.run(_run_server(args, token, console_token, artifact_roots))


def _artifact_roots(pairs: list[str]) -> dict[str, Path]:
    roots: dict[str, Path] = {}
    for pair in pairs:
        instance, sep, folder = pair.partition("=")
        if not sep or not instance or not folder:
            raise SystemExit(f"--artifacts expects ID=DIR, got {pair!r}")
        roots[instance] = Path(folder)
    return roots


def console_login_url(cp: ControlPlane, show_link: bool) -> str:
    """The console's URL; with `show_link` a login link that works once (a one-time code, not the token)."""
    link = cp.console_login_url() if show_link else None
    return link or f"{cp.http_url}/"


async def _run_server(args: argparse.Namespace, token: str, console_token: str, roots: dict[str, Path]) -> int:
    from agent_lab.controlplane.console import ConsoleConfig
    from agent_lab.controlplane.server import ControlPlane

    context = None
    if args.tls_cert is not None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(args.tls_cert, args.tls_key)
    cp = ControlPlane(
        args.store or args.db,
        gateway_id=args.gateway_id,
        reuse_port=args.reuse_port,
        tokens={token: args.instance},
        host=args.host,
        port=args.port,
        http_port=None if args.http_port < 0 else args.http_port,
        heartbeat_interval_ms=args.heartbeat_ms,
        ssl_context=context,
        console=ConsoleConfig(token=console_token, host=args.http_host, artifact_roots=roots),
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await cp.start()
    except OSError as exc:
        await cp.stop()  # the listener that did start (the WebSocket one when the HTTP port was taken)
        if exc.errno not in (errno.EADDRINUSE, errno.EADDRNOTAVAIL):
            raise
        print(f"agent-driver controlplane: {_listen_failure(exc, args)}", file=sys.stderr)
        return 1
    try:
        print(f"control plane: {cp.url}  api: {cp.http_url or '-'}", file=sys.stderr, flush=True)
        if cp.http_url is not None:
            shown = args.console_token_file is None
            where = "" if shown else f" (log in with the token in {args.console_token_file})"
            url = console_login_url(cp, shown)
            print(f"console: {url}{where}", file=sys.stderr, flush=True)
        await stop.wait()
    finally:
        await cp.__aexit__(None, None, None)  # started above, so that a taken port is one line
    return 0


def _listen_failure(exc: OSError, args: argparse.Namespace) -> str:
    """One line for a port this control plane cannot listen on: which, and what to do."""
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"cannot listen on {args.host} / {args.http_host}: no such local address (--host, --http-host)"
    taken = _taken_ports(args)
    return _in_use(*taken[0]) if taken else _in_use("--port or --http-port", args.host, args.port)


def _taken_ports(args: argparse.Namespace) -> list[tuple[str, str, int]]:
    """(flag, host, port) of each port this control plane would listen on that is taken now."""
    wanted = [("--port", args.host, args.port), ("--http-port", args.http_host, args.http_port)]
    reuse = bool(getattr(args, "reuse_port", False))  # gateways share their ports: only a non-sharer is in the way
    return [(flag, host, port) for flag, host, port in wanted if port > 0 and _taken(host, port, reuse=reuse)]


def _in_use(flag: str, host: str, port: int) -> str:
    then = " (boot payloads then name the new one in control.url)" if flag == "--port" else ""
    return (
        f"{host}:{port} is already in use (another control plane, or another program, listens there): "
        f"stop it, or choose another {flag}{then}"
    )


def _taken(host: str, port: int, *, reuse: bool = False) -> bool:
    """True when `host:port` cannot be bound now (asked after a failed start, to name the port). With
    `reuse` (gateways, `--reuse-port`) the probe shares the port as the gateways do, so a running
    gateway does not make the next one refuse to start."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


# -- client -------------------------------------------------------------------------------------


def _client(command: str, argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog=f"agent-driver controlplane {command}")
    p.add_argument("--url", default="http://127.0.0.1:8766", help="the control plane's HTTP API")
    p.add_argument("--token-file", required=True, type=Path)
    if command != "faults":
        p.add_argument("--instance", required=True)
    if command == "send":
        p.add_argument("--kind", required=True)
        p.add_argument("--command-id")
        p.add_argument("--run-id")
        p.add_argument("--text")
        p.add_argument("--field", action="append", default=[], metavar="KEY=VALUE")
        p.add_argument("--json", dest="body", help="a JSON object of fields")
    elif command == "events":
        p.add_argument("--after-seq", type=int)
        p.add_argument("--kind", action="append")
        p.add_argument("--wait", type=float, metavar="SECONDS", help="wait up to SECONDS for a matching event")
    elif command == "faults":
        p.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE")
        p.add_argument("--reset", action="store_true")
    args = parse(p, argv)
    prog = f"agent-driver controlplane {command}"
    if command == "send" and args.kind not in COMMAND_KINDS:
        print(f"{prog}: {unknown_kind(args.kind)}", file=sys.stderr)
        return 2
    try:
        token = args.token_file.read_text().strip()
    except OSError as exc:
        print(f"{prog}: cannot read --token-file {args.token_file}: {exc.strerror}", file=sys.stderr)
        return 2
    base = args.url.rstrip("/")

    if command == "faults":
        if not args.set and not args.reset:
            return _show(_call(base, token, "GET", "/api/faults"))
        body = {k: v for k, v in (_pair(s) for s in args.set)}
        if args.reset:
            body["reset"] = True
        return _show(_call(base, token, "POST", "/api/faults", body))

    prefix = "/api/instances/" + urllib.parse.quote(args.instance, safe="")
    if command == "send":
        try:
            body = _command_body(args)
        except ValueError as exc:  # --json that is not JSON
            print(f"{prog}: --json is not valid JSON: {exc}", file=sys.stderr)
            return 2
        return _show(_call(base, token, "POST", prefix + "/commands", body), prog)
    if command == "events":
        query: list[tuple[str, str]] = [("kind", k) for k in args.kind or []]
        if args.after_seq is not None:
            query.append(("after_seq", str(args.after_seq)))
        if args.wait is not None:
            query.append(("wait_ms", str(round(args.wait * 1000))))
        suffix = "?" + urllib.parse.urlencode(query) if query else ""
        status, answer = _call(base, token, "GET", prefix + "/events" + suffix, timeout=30 + (args.wait or 0))
        if args.wait is not None and status == 200 and not answer.get("events"):
            print(json.dumps(answer, indent=2))
            print(f"no matching event within {args.wait:g} s", file=sys.stderr)
            return 1
        return _show((status, answer))
    if command == "commands":
        return _show(_call(base, token, "GET", prefix + "/commands"))
    if command == "checkpoints":  # PROTOCOL §8.1: the instance's complete checkpoints
        return _show(_call(base, token, "GET", prefix + "/checkpoints"))
    return _show(_call(base, token, "POST", prefix + "/terminate", {}))


def _pair(text: str) -> tuple[str, Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise SystemExit(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(raw)
    except ValueError:
        return key, raw


def _command_body(args: argparse.Namespace) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if args.body:
        loaded = json.loads(args.body)
        if not isinstance(loaded, dict):
            raise SystemExit("--json must be a JSON object")
        body.update(loaded)
    body.update(_pair(f) for f in args.field)
    body["kind"] = args.kind
    if args.command_id:
        body["command_id"] = args.command_id
    if args.run_id:
        body["run_id"] = args.run_id
    if args.text is not None:
        body["input"] = {"text": args.text, "attachments": []}
    if args.kind == "input.start" and "run_id" not in body:
        body["run_id"] = f"run-{uuid.uuid4().hex[:12]}"
    return body


def _call(
    base: str, token: str, method: str, path: str, body: dict[str, Any] | None = None, timeout: float = 30
) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method)
    req.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        req.add_header("Content-Type", "application/json")

    def once() -> tuple[int, Any]:
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    try:
        return RETRY_REFUSED(once)
    except urllib.error.URLError as exc:
        return 0, {"error": f"cannot reach {base}: {exc.reason}"}


def _refused(exc: BaseException) -> bool:
    """Only a refused connection is retried: the request never reached the control plane, so even a
    command without a command_id cannot be stored twice."""
    return isinstance(exc, urllib.error.URLError) and isinstance(exc.reason, ConnectionRefusedError)


# A control plane that is (re)starting: a few tries over ~2 s, full jitter, then the error.
RETRY_REFUSED = tenacity.Retrying(
    retry=tenacity.retry_if_exception(_refused),
    wait=tenacity.wait_random_exponential(multiplier=0.1, max=1.0),
    stop=tenacity.stop_after_attempt(5),
    reraise=True,
)


def unknown_kind(kind: str) -> str:
    """The line for a command kind the protocol does not have (the closest known one suggested)."""
    import difflib

    close = difflib.get_close_matches(kind, COMMAND_KINDS, n=1)
    meant = f"; did you mean {close[0]}?" if close else ""
    return f"unknown --kind {kind!r}{meant} (known: {', '.join(COMMAND_KINDS)})"


def _show(answer: tuple[int, Any], prog: str = "agent-driver controlplane") -> int:
    """The answer's JSON on stdout; for a refusal, also its error in one line on stderr (exit 1)."""
    status, body = answer
    print(json.dumps(body, indent=2))
    if 200 <= status < 300:
        return 0
    error = body.get("error") if isinstance(body, dict) else None
    if status == 0:
        print(f"{prog}: {error}; is the control plane running there? (--url)", file=sys.stderr)
    else:
        print(f"{prog}: the control plane refused it (HTTP {status}): {error or 'no reason given'}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
