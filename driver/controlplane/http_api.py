"""The control plane's local HTTP JSON API, on its own loopback port.

It is a separate listener because the `websockets` handshake parser refuses any request with a body, so
`process_request` cannot serve `POST`. The HTTP/1.1 handling here is deliberately minimal (one request
per connection, `Content-Length` bodies up to 1 MiB): it serves a CLI and tests on the same machine,
nothing else. Every route except `/api/health` needs the same bearer token as the driver link.

Routes:
    GET  /api/health
    GET  /api/instances/{id}                   link state, highest epoch, last hello and heartbeat, driver_url
    POST /api/instances/{id}/commands          {"kind": ..., "command_id"?: ..., ...fields} -> {command_id, seq}
    GET  /api/instances/{id}/commands
    GET  /api/instances/{id}/events?after_seq=N&kind=K&run_id=R&limit=L&wait_ms=W
                                               wait_ms: when nothing matches yet, wait up to W ms for a match
    POST /api/instances/{id}/terminate         close the link with 4410 and refuse it from now on
    POST /api/instances/{id}/close             {"code": 1011, "reason": "..."}
    GET  /api/faults
    POST /api/faults                           {"knob": value, ...} or {"reset": true}
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from http import HTTPStatus
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

import msgspec
import structlog

from driver.controlplane.server import sendable_close_code
from driver.controlplane.store import CommandExists

if TYPE_CHECKING:
    from driver.controlplane.server import ControlPlane

log = structlog.get_logger("agent_driver.controlplane.http")

MAX_BODY = 1024 * 1024
MAX_HEAD = 64 * 1024
DEFAULT_EVENT_LIMIT = 1000
MAX_WAIT_MS = 600_000
READ_TIMEOUT_S = 30

Answer = tuple[int, Any]


class HttpError(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


async def start_http_api(cp: ControlPlane, port: int) -> asyncio.Server:
    api = HttpApi(cp)
    # Loopback only, whatever host the WebSocket listener uses: this API can steer any instance.
    return await asyncio.start_server(api.serve_connection, "127.0.0.1", port, limit=MAX_HEAD)


class HttpApi:
    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp

    async def serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                status, body = await self._read_and_dispatch(reader)
            except HttpError as exc:
                status, body = exc.status, {"error": exc.message}
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, TimeoutError):
                status, body = HTTPStatus.BAD_REQUEST, {"error": "malformed request"}
            data = json.dumps(body).encode()
            reason = HTTPStatus(status).phrase
            writer.write(
                f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
                + data
            )
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _read_and_dispatch(self, reader: asyncio.StreamReader) -> Answer:
        # The time limit is for reading the request; answering may take longer (events?wait_ms=).
        async with asyncio.timeout(READ_TIMEOUT_S):
            method, target, headers, body = await self._read(reader)
        return await self.dispatch(method.upper(), target, headers.get("authorization"), body)

    async def _read(self, reader: asyncio.StreamReader) -> tuple[str, str, dict[str, str], bytes]:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, target, _version = lines[0].split(" ", 2)
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        if length > MAX_BODY:
            raise HttpError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "body over 1 MiB")
        body = await reader.readexactly(length) if length else b""
        return method, target, headers, body

    async def dispatch(self, method: str, target: str, authorization: str | None, body: bytes) -> Answer:
        """Route one request; returns (status, JSON-able body). Raises HttpError for failures."""
        url = urlsplit(target)
        parts = [unquote(p) for p in url.path.strip("/").split("/")]
        query = parse_qs(url.query)
        if parts == ["api", "health"] and method == "GET":
            return HTTPStatus.OK, {"ok": True}
        if parts[:1] != ["api"]:
            raise HttpError(HTTPStatus.NOT_FOUND, "not found")
        allowed = self.cp.token_allows(authorization)
        if allowed is False:
            raise HttpError(HTTPStatus.UNAUTHORIZED, "bad or missing bearer token")
        if parts == ["api", "faults"]:
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
        return {
            "instance_id": instance_id,
            "connected": self.cp.connected(instance_id),
            "highest_epoch": self.cp.store.highest_epoch(instance_id),
            "hello": self.cp.hello(instance_id),
            "last_heartbeat": self.cp.last_heartbeat(instance_id),
            "events_stored": self.cp.store.count_events(instance_id),
            "driver_url": self.cp.url,  # what a boot payload's control.url should say (`controlplane boot`)
        }

    async def _post_command(self, instance_id: str, args: dict[str, Any]) -> Answer:
        kind = args.pop("kind", None)
        if not isinstance(kind, str) or not kind:
            raise HttpError(HTTPStatus.BAD_REQUEST, "kind (a string) is required")
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
