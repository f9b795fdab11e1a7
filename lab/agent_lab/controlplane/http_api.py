"""The control plane's HTTP JSON API, on its own port (loopback unless the console guards it).

It is a separate listener because the `websockets` handshake parser refuses any request with a body, so
`process_request` cannot serve `POST`. The HTTP/1.1 handling here is deliberately minimal (one request
per connection, `Content-Length` bodies up to 1 MiB): it serves a CLI and tests on the same machine,
nothing else. Every route except `/api/health` needs the same bearer token as the driver link, or the
web console's token. With a console (`ControlPlane(console=...)`) the same port serves it at `/` (see
`lab/agent_lab/controlplane/console/`), and may bind a non-loopback host, where every request needs that token.

Routes:
    GET  /api/health
    GET  /api/instances/{id}                   link state, highest epoch, last hello and heartbeat, activity, driver_url
    POST /api/instances/{id}/commands          {"kind": ..., "command_id"?: ..., ...fields} -> {command_id, seq}
    GET  /api/instances/{id}/commands
    GET  /api/instances/{id}/events?after_seq=N&kind=K&run_id=R&limit=L&wait_ms=W
                                               wait_ms: when nothing matches yet, wait up to W ms for a match
    POST /api/instances/{id}/terminate         close the link with 4410 and refuse it from now on
    POST /api/instances/{id}/close             {"code": 1011, "reason": "..."}
    GET  /api/faults                           the operator's token only (the console token, or
    POST /api/faults                           `operator_token`): {"knob": value, ...} or {"reset": true}

A request that changes anything must not come from another origin and must declare a JSON body
(`console/guard.py`; PROTOCOL §9), with or without a console.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from http import HTTPStatus
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

import msgspec

from agent_lab.controlplane.console import guard
from agent_lab.controlplane.console.httpio import MAX_HEAD, HttpError, Request, read_request, respond_json
from agent_lab.controlplane.link import sendable_close_code
from agent_lab.controlplane.store import CommandExists
from driver import logs
from driver.protocol.commands import COMMAND_KINDS
from driver.telemetry.activity import describe as describe_activity

if TYPE_CHECKING:
    from agent_lab.controlplane.console.routes import Console
    from agent_lab.controlplane.server import ControlPlane

log = logs.get("agent_driver.controlplane.http")

MAX_BODY = 1024 * 1024
DEFAULT_EVENT_LIMIT = 1000
MAX_WAIT_MS = 600_000
READ_TIMEOUT_S = 30

Answer = tuple[int, Any]

__all__ = ["HttpApi", "HttpError", "HttpListener", "start_http_api"]


class HttpListener:
    """The listening socket plus the console's open streams, which a close must end too (an
    `asyncio.Server` does not wait for, or close, connections it already handed out)."""

    def __init__(self, server: asyncio.Server, console: Console | None) -> None:
        self.server = server
        self.console = console

    @property
    def port(self) -> int:
        return int(self.server.sockets[0].getsockname()[1])

    def close(self) -> None:
        self.server.close()
        if self.console is not None:
            self.console.close_streams()

    async def wait_closed(self) -> None:
        await self.server.wait_closed()


async def start_http_api(cp: ControlPlane, port: int) -> HttpListener:
    console = None
    host = "127.0.0.1"
    if cp.console_config is not None:
        from agent_lab.controlplane.console.routes import Console

        console = Console(cp, cp.console_config)
        host = cp.console_config.host
    # Loopback unless a console token guards every request: this API can steer any instance.
    api = HttpApi(cp, console)
    # Gateways sharing a port (SO_REUSEPORT) share the HTTP port too: any of them answers from the store.
    server = await asyncio.start_server(
        api.serve_connection, host, port, limit=MAX_HEAD, reuse_port=cp.reuse_port or None
    )
    listener = HttpListener(server, console)
    api.port = listener.port
    if console is not None:
        console.bind_port(listener.port)
    return listener


class HttpApi:
    def __init__(self, cp: ControlPlane, console: Console | None = None) -> None:
        self.cp = cp
        self.console = console
        self.port = 0

    async def serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                request = await read_request(reader)
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, TimeoutError):
                await respond_json(writer, HTTPStatus.BAD_REQUEST, {"error": "malformed request"})
                return
            if self.console is not None and await self.console.handle(request, writer):
                return
            if self.console is None:
                # No console, no cookie: still no other origin, and JSON bodies only.
                reason = guard.refusal(
                    request.method, request.parts, request.headers, port=self.port, bound_host="127.0.0.1",
                    cookie_session=False,
                )  # fmt: skip
                if reason is not None:
                    await respond_json(writer, HTTPStatus.FORBIDDEN, {"error": reason})
                    return
            try:
                status, body = await self._answer(request)
            except HttpError as exc:
                status, body = exc.status, {"error": exc.message}
            except (asyncio.IncompleteReadError, ValueError, TimeoutError):
                status, body = HTTPStatus.BAD_REQUEST, {"error": "malformed request"}
            await respond_json(writer, status, body)
        except ConnectionError:
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _answer(self, request: Request) -> Answer:
        # The time limit is for reading the request; answering may take longer (events?wait_ms=).
        async with asyncio.timeout(READ_TIMEOUT_S):
            body = await request.body(MAX_BODY)
        # The console's token (from its login cookie or a bearer header) may drive every instance.
        operator = self.console is not None and self.console.authorized(request)
        operator = operator or self.cp.is_operator(request.headers.get("authorization"))
        return await self.dispatch(request.method, request.target, request.headers.get("authorization"), body, operator)

    async def dispatch(
        self, method: str, target: str, authorization: str | None, body: bytes, operator: bool = False
    ) -> Answer:
        """Route one request; returns (status, JSON-able body). Raises HttpError for failures."""
        url = urlsplit(target)
        parts = [unquote(p) for p in url.path.strip("/").split("/")]
        query = parse_qs(url.query)
        if parts == ["api", "health"] and method == "GET":
            return HTTPStatus.OK, {"ok": True}
        if parts[:1] != ["api"]:
            raise HttpError(HTTPStatus.NOT_FOUND, "not found")
        allowed = True if operator else self.cp.token_allows(authorization)
        if allowed is False:
            raise HttpError(HTTPStatus.UNAUTHORIZED, "bad or missing bearer token")
        if parts == ["api", "faults"]:
            if not operator:
                raise HttpError(HTTPStatus.FORBIDDEN, "the fault API needs the operator's token, not a driver's")
            if method == "GET":
                return HTTPStatus.OK, self.cp.faults.as_dict()
            if method == "POST":
                return self._set_faults(_json_object(body))
            raise HttpError(HTTPStatus.METHOD_NOT_ALLOWED, "use GET or POST")
        if len(parts) < 3 or parts[1] != "instances":
            raise HttpError(HTTPStatus.NOT_FOUND, "not found")
        instance_id = parts[2]
        if allowed is not True and instance_id not in allowed:
            raise HttpError(HTTPStatus.FORBIDDEN, "instance not allowed for this token")
        rest = parts[3:]
        route = (method, rest[0] if rest else "")
        if len(rest) > 1:
            raise HttpError(HTTPStatus.NOT_FOUND, "not found")
        if route == ("GET", ""):
            return HTTPStatus.OK, self._instance(instance_id)
        if route == ("POST", "commands"):
            return await self._post_command(instance_id, _json_object(body))
        if route == ("GET", "commands"):
            return HTTPStatus.OK, {"commands": self.cp.commands(instance_id)}
        if route == ("GET", "events"):
            return HTTPStatus.OK, await self._events(instance_id, query)
        if route == ("GET", "checkpoints"):
            return HTTPStatus.OK, {"checkpoints": self.cp.checkpoints(instance_id)}
        if route == ("GET", "checkpoint-file"):
            return HTTPStatus.OK, self._checkpoint_file(instance_id, query.get("sha256", [""])[0])
        if route == ("POST", "terminate"):
            await self.cp.terminate(instance_id)
            return HTTPStatus.OK, {"terminated": True}
        if route == ("POST", "close"):
            args = _json_object(body)
            code = args.get("code", 1011)
            if not isinstance(code, int) or not sendable_close_code(code):
                raise HttpError(HTTPStatus.BAD_REQUEST, "code must be a sendable close code (or 1006)")
            closed = await self.cp.close_link(instance_id, code, str(args.get("reason", "")))
            return HTTPStatus.OK, {"closed": closed}
        raise HttpError(HTTPStatus.NOT_FOUND, "not found")

    def _instance(self, instance_id: str) -> dict[str, Any]:
        beat = self.cp.last_heartbeat(instance_id)
        activity = beat.get("activity") if beat else None
        return {
            "instance_id": instance_id,
            "connected": self.cp.connected(instance_id),
            "highest_epoch": self.cp.store.highest_epoch(instance_id),
            "hello": self.cp.hello(instance_id),
            "last_heartbeat": beat,
            # The provider tree's activity from the last heartbeat (PROTOCOL §2.5), and one line of it.
            "activity": activity,
            "activity_line": describe_activity(activity),
            "events_stored": self.cp.store.count_events(instance_id),
            "driver_url": self.cp.url,  # what a boot payload's control.url should say (`controlplane boot`)
        }

    def _checkpoint_file(self, instance_id: str, sha256: str) -> dict[str, Any]:
        """One file of the instance's checkpoints (PROTOCOL §8.1), base64: only a file one of them lists."""
        if not any(f["sha256"] == sha256 for c in self.cp.checkpoints(instance_id) for f in c["files"]):
            raise HttpError(HTTPStatus.NOT_FOUND, "no checkpoint of this instance has that file")
        data = self.cp.store.checkpoint_blob(sha256)
        if data is None:
            raise HttpError(HTTPStatus.NOT_FOUND, "no checkpoint of this instance has that file")
        return {"sha256": sha256, "size": len(data), "data_b64": base64.b64encode(data).decode("ascii")}

    async def _post_command(self, instance_id: str, args: dict[str, Any]) -> Answer:
        kind = args.pop("kind", None)
        if not isinstance(kind, str) or not kind:
            raise HttpError(HTTPStatus.BAD_REQUEST, "kind (a string) is required")
        if kind not in COMMAND_KINDS:
            # Stored and sent, an unknown kind would only come back `failed` from the driver later:
            # the API's caller (a person at the CLI, usually) hears it now. The Python API
            # (ControlPlane.send_command) still sends anything, for tests of the driver's refusal.
            known = ", ".join(COMMAND_KINDS)
            raise HttpError(HTTPStatus.BAD_REQUEST, f"unknown command kind {kind[:64]!r} (known: {known})")
        command_id = args.pop("command_id", None)
        if command_id is not None and not isinstance(command_id, str):
            raise HttpError(HTTPStatus.BAD_REQUEST, "command_id must be a string")
        for reserved in ("type", "seq"):
            if reserved in args:
                raise HttpError(HTTPStatus.BAD_REQUEST, f"{reserved} is assigned by the control plane")
        try:
            command_id, seq = await self.cp.send_command(instance_id, kind, command_id=command_id, **args)
        except CommandExists as exc:
            raise HttpError(HTTPStatus.CONFLICT, str(exc)) from None
        return HTTPStatus.CREATED, {"command_id": command_id, "seq": seq, "sent": self.cp.connected(instance_id)}

    async def _events(self, instance_id: str, query: dict[str, list[str]]) -> dict[str, Any]:
        try:
            after_seq = int(query["after_seq"][0]) if "after_seq" in query else None
            limit = int(query["limit"][0]) if "limit" in query else DEFAULT_EVENT_LIMIT
            wait_ms = int(query["wait_ms"][0]) if "wait_ms" in query else 0
        except ValueError:
            raise HttpError(HTTPStatus.BAD_REQUEST, "after_seq, limit and wait_ms must be integers") from None
        if not 0 <= wait_ms <= MAX_WAIT_MS:
            raise HttpError(HTTPStatus.BAD_REQUEST, f"wait_ms must be between 0 and {MAX_WAIT_MS}")
        kinds = query.get("kind")
        run_id = query.get("run_id", [None])[0]
        found: list[dict[str, Any]] = []

        def matched() -> bool:
            if self.cp.stopping:  # answer what there is: a stopping server must not wait on its clients
                return True
            found[:] = self.cp.store.events(instance_id, kinds=kinds, run_id=run_id, after_seq=after_seq, limit=limit)
            return bool(found)

        # A long poll: a client waiting for a run's end asks once instead of polling in a loop.
        if not matched() and wait_ms > 0:
            with contextlib.suppress(TimeoutError):
                await self.cp.wait_until(matched, wait_ms / 1000)
        return {"events": found, "last_seq": found[-1]["seq"] if found else after_seq}

    def _set_faults(self, args: dict[str, Any]) -> Answer:
        try:
            if args.pop("reset", False):
                self.cp.faults.reset()
            self.cp.faults.update(args)
        except msgspec.ValidationError as exc:
            raise HttpError(HTTPStatus.BAD_REQUEST, f"faults: {exc}") from None
        log.info("faults.set", faults=self.cp.faults.as_dict())
        return HTTPStatus.OK, self.cp.faults.as_dict()


def _json_object(body: bytes) -> dict[str, Any]:
    if not body:
        return {}
    try:
        value = json.loads(body)
    except ValueError:
        raise HttpError(HTTPStatus.BAD_REQUEST, "body is not JSON") from None
    if not isinstance(value, dict):
        raise HttpError(HTTPStatus.BAD_REQUEST, "body must be a JSON object")
    return value
