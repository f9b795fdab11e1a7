"""`agent-driver controlplane boot`: mint a one-time boot payload for a driver (PROTOCOL §1).

The payload points at the running reference control plane (its WebSocket URL is asked of its HTTP API,
which also proves the token and the instance id are accepted) and carries its token, so the file is
created with mode 0600 from the start and never overwritten. Every field of the payload is reachable:
the common ones by a flag, any other (MCP servers, host tools, skills, recovery messages...) by a JSON
fragment merged over the rest (`--json '{"execution": {"mcp_servers": [...]}}'`; objects merge key by
key, anything else replaces). The result is validated with the driver's own schema before it is
written, so a mistake is named here rather than by the driver at boot. No value (the token, an
environment variable) is ever printed.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from driver.protocol.boot import RUNTIMES

PROG = "agent-driver controlplane boot"


class MintError(Exception):
    """A problem with the request, named in one line (exit status 2)."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Write a one-time boot payload (mode 0600) for `agent-driver run --boot-file`.",
        epilog="Paths are as the driver sees them (inside a container: the container's paths).",
    )
    p.add_argument("--runtime", required=True, choices=RUNTIMES)
    p.add_argument("--instance", required=True, help="driver_instance_id")
    p.add_argument("--out", required=True, type=Path, help="the payload file to create (refused if it exists)")
    p.add_argument("--owner", metavar="UID[:GID]", help="chown the file to the driver's uid (needs privilege)")
    cp = p.add_argument_group("control plane")
    cp.add_argument("--url", default="http://127.0.0.1:8766", help="the control plane's HTTP API, asked for its URL")
    cp.add_argument("--token-file", required=True, type=Path)
    cp.add_argument("--cp-url", help="control.url as the driver should dial it (default: what the control plane says)")
    cp.add_argument("--insecure-transport", action="store_true", help="control.insecure_transport")
    cp.add_argument("--ca-file", help="control.ca_file")
    session = p.add_argument_group("session")
    session.add_argument("--cwd", required=True, help="session.cwd (absolute)")
    session.add_argument("--state-dir", required=True, help="session.state_dir (absolute)")
    session.add_argument("--memory-dir", help="session.memory_dir (absolute)")
    session.add_argument("--add-dir", action="append", default=[], help="session.additional_directories (repeatable)")
    session.add_argument("--session-id", help="session.id (default: ses-<instance>)")
    session.add_argument("--agent-id", help="session.agent_id (default: agt-<instance>)")
    session.add_argument("--kind", choices=["cattle", "pet"], default="cattle", help="session.kind")
    session.add_argument("--idle-exit-ms", help="session.idle_exit_ms: milliseconds, or `none` never to exit idle")
    execution = p.add_argument_group("execution")
    execution.add_argument("--revision", default="rev-1", help="execution.revision")
    execution.add_argument("--model", help="execution.model")
    execution.add_argument("--system-prompt", help="execution.system_prompt")
    execution.add_argument("--permission-policy", choices=["full_access", "supervised"])
    execution.add_argument("--permission-timeout-ms", type=int)
    execution.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME[=VALUE]",
        help="execution.environment; NAME alone takes the value from this environment (keeps it off the command line)",
    )
    execution.add_argument("--provider-option", action="append", default=[], metavar="KEY=VALUE",
                           help="execution.provider_options (VALUE parsed as JSON when it parses)")  # fmt: skip
    execution.add_argument("--acp-command", help="execution.acp.command, split like a shell would")
    execution.add_argument("--acp-env", action="append", default=[], metavar="NAME[=VALUE]", help="execution.acp.env")
    execution.add_argument("--native-resume", metavar="RUNTIME=VALUE", help="execution.native_resume")
    execution.add_argument("--resume-from", metavar="INSTANCE",
                           help="execution.native_checkpoint: INSTANCE's latest checkpoint (§8.1)")  # fmt: skip
    execution.add_argument("--checkpoint-dir", type=Path,
                           help="where --resume-from writes the files (default: OUT.checkpoint)")  # fmt: skip
    p.add_argument("--traceparent")
    p.add_argument("--json", action="append", default=[], dest="fragments", metavar="JSON",
                   help="a JSON object merged over the payload (repeatable, applied last)")  # fmt: skip
    return p


# -- building the payload (no I/O) --------------------------------------------------------------


def environment(items: list[str], env: Mapping[str, str], flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not name:
            raise MintError(f"{flag} {item!r}: expected NAME or NAME=VALUE")
        if not sep:
            if name not in env:
                raise MintError(f"{flag} {name}: {name} is not set in this environment (or give {name}=VALUE)")
            value = env[name]
        out[name] = value
    return out


def _json_or_text(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def merge(base: dict[str, Any], fragment: Mapping[str, Any]) -> dict[str, Any]:
    """`fragment` over `base`: objects merge key by key, any other value replaces."""
    out = dict(base)
    for key, value in fragment.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def _absolute(flag: str, value: str | None) -> str | None:
    if value is not None and not value.startswith("/"):
        raise MintError(f"{flag} must be an absolute path as the driver sees it, got {value!r}")
    return value


def build_payload(args: argparse.Namespace, *, control_url: str, token: str, env: Mapping[str, str]) -> dict[str, Any]:
    session: dict[str, Any] = {
        "id": args.session_id or f"ses-{args.instance}",
        "agent_id": args.agent_id or f"agt-{args.instance}",
        "kind": args.kind,
        "cwd": _absolute("--cwd", args.cwd),
        "state_dir": _absolute("--state-dir", args.state_dir),
    }
    if args.memory_dir is not None:
        session["memory_dir"] = _absolute("--memory-dir", args.memory_dir)
    if args.add_dir:
        session["additional_directories"] = [_absolute("--add-dir", d) for d in args.add_dir]
    if args.idle_exit_ms is not None:
        if args.idle_exit_ms == "none":
            session["idle_exit_ms"] = None
        elif args.idle_exit_ms.isdigit():
            session["idle_exit_ms"] = int(args.idle_exit_ms)
        else:
            raise MintError(f"--idle-exit-ms must be a number of milliseconds or `none`, got {args.idle_exit_ms!r}")
    execution: dict[str, Any] = {"revision": args.revision, "runtime": args.runtime}
    for key, value in (
        ("model", args.model),
        ("system_prompt", args.system_prompt),
        ("permission_policy", args.permission_policy),
        ("permission_timeout_ms", args.permission_timeout_ms),
    ):
        if value is not None:
            execution[key] = value
    if args.env:
        execution["environment"] = environment(args.env, env, "--env")
    if args.provider_option:
        options: dict[str, Any] = {}
        for item in args.provider_option:
            key, sep, raw = item.partition("=")
            if not sep or not key:
                raise MintError(f"--provider-option {item!r}: expected KEY=VALUE")
            options[key] = _json_or_text(raw)
        execution["provider_options"] = options
    if args.acp_command is not None or args.acp_env:
        try:
            command = shlex.split(args.acp_command or "")
        except ValueError as exc:
            raise MintError(f"--acp-command: {exc}") from None
        execution["acp"] = {"command": command, "env": environment(args.acp_env, env, "--acp-env")}
    if args.native_resume is not None:
        runtime, sep, value = args.native_resume.partition("=")
        if not sep:
            raise MintError("--native-resume: expected RUNTIME=VALUE")
        execution["native_resume"] = {"runtime": runtime, "value": value}
    control: dict[str, Any] = {"url": control_url, "token": token}
    if args.insecure_transport:
        control["insecure_transport"] = True
    if args.ca_file is not None:
        control["ca_file"] = args.ca_file
    payload: dict[str, Any] = {
        "protocol": 1,
        "driver_instance_id": args.instance,
        "control": control,
        "session": session,
        "execution": execution,
    }
    if args.traceparent is not None:
        payload["traceparent"] = args.traceparent
    for raw in args.fragments:
        try:
            fragment = json.loads(raw)
        except ValueError as exc:
            raise MintError(f"--json is not valid JSON: {exc}") from None
        if not isinstance(fragment, dict):
            raise MintError("--json must be a JSON object")
        payload = merge(payload, fragment)
    return payload


def encode_checked(payload: Mapping[str, Any]) -> bytes:
    """The payload as the driver will read it; MintError naming the field when the driver would refuse it."""
    from driver.boot import BootError, parse_payload
    from driver.net.link import TransportRefused, check_transport

    data = json.dumps(payload).encode()
    try:
        boot = parse_payload(data)
    except BootError as exc:  # its message names the field, never a value
        raise MintError(str(exc)) from None
    try:
        check_transport(boot.control)  # what `agent-driver run` checks before it dials (exit 78)
    except TransportRefused as exc:
        raise MintError(f"{exc}, and the driver would refuse it; {transport_hint(boot.control.url)}") from None
    return data


def transport_hint(url: str) -> str:
    """The next step for a control URL the driver refuses: what to give instead."""
    from urllib.parse import urlsplit

    if urlsplit(url).scheme in ("http", "https"):
        return (
            "the driver dials a WebSocket: give --cp-url the control plane's driver endpoint "
            "(ws://127.0.0.1:8765/driver for `agent-driver controlplane` on its default port, wss:// for "
            "another host), not its HTTP API, or leave --cp-url out to ask the control plane for it"
        )
    return "give --cp-url a wss:// URL, a ws:// one to a loopback host, or add --insecure-transport"


# -- I/O -------------------------------------------------------------------------------------------


def parse_owner(text: str) -> tuple[int, int]:
    uid, _, gid = text.partition(":")
    if not uid.isdigit() or (gid and not gid.isdigit()):
        raise MintError(f"--owner must be UID or UID:GID (numbers), got {text!r}")
    return int(uid), int(gid) if gid else -1


def write_payload(path: Path, data: bytes, owner: tuple[int, int] | None = None) -> None:
    """Create `path` with mode 0600 (never a moment readable by others), owned by `owner` if given."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        raise MintError(f"{path} exists; a payload is used once (the driver deletes it): remove it first") from None
    except OSError as exc:
        raise MintError(f"cannot create {path}: {exc.strerror}") from None
    try:
        if owner is not None:
            os.fchown(fd, *owner)
        os.write(fd, data)
        os.fsync(fd)
    except OSError as exc:
        os.close(fd)
        path.unlink(missing_ok=True)
        raise MintError(f"cannot write {path}: {exc.strerror}") from None
    os.close(fd)


def ask_driver_url(base: str, token: str, instance: str) -> str:
    """The control plane's own WebSocket URL, from the instance route (which checks token and instance)."""
    import urllib.parse

    from agent_lab.controlplane.cli import _call

    status, body = _call(base.rstrip("/"), token, "GET", "/api/instances/" + urllib.parse.quote(instance, safe=""))
    if status == 0:
        raise MintError(f"{body['error']}: is the control plane running? (or give --cp-url)")
    if status == 401:
        raise MintError(f"the control plane at {base} refused the token in --token-file")
    if status == 403:
        raise MintError(f"the control plane's token does not allow instance {instance!r} (see its --instance)")
    if status != 200 or not isinstance(body, dict) or not isinstance(body.get("driver_url"), str):
        raise MintError(f"unexpected answer from {base} (HTTP {status}); give --cp-url")
    return str(body["driver_url"])


def mint(args: argparse.Namespace, env: Mapping[str, str]) -> str:
    """Write the payload; returns the control URL it points at."""
    try:
        token = args.token_file.read_text().strip()
    except OSError as exc:
        raise MintError(f"cannot read --token-file {args.token_file}: {exc.strerror}") from None
    if not token:
        raise MintError(f"--token-file {args.token_file} is empty")
    owner = parse_owner(args.owner) if args.owner else None
    url = args.cp_url or ask_driver_url(args.url, token, args.instance)
    payload = build_payload(args, control_url=url, token=token, env=env)
    if args.resume_from is not None:
        from agent_lab.controlplane.resume_from import ResumeError, resume_from

        folder = args.checkpoint_dir or args.out.with_name(args.out.name + ".checkpoint")
        try:
            payload["execution"]["native_checkpoint"] = resume_from(
                args.url, token, args.resume_from, args.runtime, folder.absolute(), owner
            )
        except ResumeError as exc:
            raise MintError(f"--resume-from: {exc}") from None
    data = encode_checked(payload)
    write_payload(args.out, data, owner)
    return url


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        url = mint(args, os.environ)
    except MintError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    print(
        f"wrote a {args.runtime} boot payload for {args.instance} (control plane {url}) to {args.out}, mode 0600; "
        "it holds the control token and the driver deletes it as it starts",
        file=sys.stderr,
    )
    return 0
