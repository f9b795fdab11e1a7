"""The console's own routes on the HTTP API port; everything else falls through to the JSON API.

    GET  /                                      the page (the login form without a session)
    GET  /?login=CODE                           log in from the printed link (a one-time code): sets the
                                                session cookie, redirects to /; a used code logs nobody in
    POST /login                                 the login form (token=T, form-encoded)
    GET  /static/{file}                         the page's CSS and JavaScript
    GET  /vendor/{file}                         xterm.js and its CSS, from node_modules (see vendor.py)
    GET  /console/instances                     every known instance, summarised
    GET  /console/instances/{id}/stream         SSE (see stream.py); resumes from Last-Event-ID or ?after=ROW
    POST /console/instances/{id}/uploads        {"name": N, "data_b64": ...} -> an attachment for input.start
    GET  /console/instances/{id}/artifacts?event_id=E   the artifact's bytes
    GET  /uploads/{key}/{name}                  an uploaded attachment (the driver fetches it)

The JSON API (`/api/...`) accepts the console token (bearer, or the session a login issued) as a token
for every instance, and as the operator's token for the fault API. A request that changes anything
passes `guard.refusal` first (the console's own Origin, a JSON body).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
from http import HTTPStatus
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, quote

from agent_lab.controlplane.console import files, guard, vendor
from agent_lab.controlplane.console.auth import cookie, cookie_name, has_bearer_token, session_cookie, token_matches
from agent_lab.controlplane.console.httpio import HttpError, Request, respond, respond_json
from agent_lab.controlplane.console.sessions import LoginCodes, Sessions
from agent_lab.controlplane.console.stream import InstanceStream
from agent_lab.controlplane.console.views import InstanceViews

if TYPE_CHECKING:
    from agent_lab.controlplane.console.config import ConsoleConfig
    from agent_lab.controlplane.server import ControlPlane

STATIC_TYPES = {".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".png": "image/png"}
HTML = "text/html; charset=utf-8"
# The page loads nothing from elsewhere and runs only its own script. Inline styles are allowed for
# xterm.js, which sizes its terminal with <style> elements it creates; no inline script runs.
CSP = (
    "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'; "
    "form-action 'self'"
)


def _static(name: str) -> bytes:
    return resources.files("agent_lab.controlplane.console").joinpath("static", name).read_bytes()


class Console:
    def __init__(self, cp: ControlPlane, config: ConsoleConfig) -> None:
        self.cp = cp
        self.config = config
        self.queries = cp.console_queries()
        self.views = InstanceViews(cp, self.queries)
        self.uploads = config.uploads_dir or cp.db_path.with_name(cp.db_path.name + ".uploads")
        self._streams: set[InstanceStream] = set()
        self.sessions = Sessions(config.token)
        self.codes = LoginCodes()
        self.port = 0  # set once the port is bound (bind_port): the cookie's name and the Origin need it

    def bind_port(self, port: int) -> None:
        self.port = port

    @property
    def cookie(self) -> str:
        return cookie_name(self.port)

    def login_url(self, http_url: str) -> str:
        """A login link that works once (a fresh code each call)."""
        return f"{http_url}/?login={self.codes.mint()}"

    def has_session(self, request: Request) -> bool:
        return self.sessions.valid(cookie(request.headers, self.cookie), self.port)

    def authorized(self, request: Request) -> bool:
        return has_bearer_token(self.config.token, request.headers) or self.has_session(request)

    def refusal(self, request: Request) -> str | None:
        return guard.refusal(
            request.method,
            request.parts,
            request.headers,
            port=self.port,
            bound_host=self.config.host,
            cookie_session=self.has_session(request),
        )

    def close_streams(self) -> None:
        """At stop: end every open stream, then release the store connection (streams touch it only
        synchronously and only while open)."""
        for stream in list(self._streams):
            stream.close()
        self.queries.close()

    async def handle(self, request: Request, writer: asyncio.StreamWriter) -> bool:
        """Answer the request if it is the console's (or refused by the token gate or the guard);
        False otherwise."""
        try:
            reason = self.refusal(request)
            if reason is not None:
                raise HttpError(HTTPStatus.FORBIDDEN, reason)
            return await self._route(request, writer)
        except HttpError as exc:
            await respond_json(writer, exc.status, {"error": exc.message})
            return True

    async def _route(self, request: Request, writer: asyncio.StreamWriter) -> bool:
        parts, method = request.parts, request.method
        head = parts[0] if parts else ""
        if head == "static" and len(parts) == 2 and method == "GET":
            await self._serve_static(parts[1], writer)
            return True
        if head == "vendor" and len(parts) == 2 and method == "GET":
            found = vendor.read(parts[1])
            if found is None:
                raise HttpError(HTTPStatus.NOT_FOUND, "not found (is node_modules installed? run make setup)")
            await respond(writer, HTTPStatus.OK, found[0], found[1])
            return True
        if head == "uploads" and len(parts) == 3 and method == "GET":
            data = files.read_upload(self.uploads, parts[1], parts[2])
            await respond(writer, HTTPStatus.OK, data, "application/octet-stream")
            return True
        if parts == [""] and method == "GET":
            await self._page(request, writer)
            return True
        if parts == ["login"] and method == "POST":
            form = parse_qs((await request.body(4096)).decode("utf-8", "replace"))
            await self._login(form.get("token", [""])[0], writer)
            return True
        authorized = self.authorized(request)
        if head == "console":
            if not authorized:
                raise HttpError(HTTPStatus.UNAUTHORIZED, "log in to the console first (its token is missing or wrong)")
            await self._console_api(request, parts[1:], writer)
            return True
        if self.config.gate_everything and not authorized:
            raise HttpError(HTTPStatus.UNAUTHORIZED, "this port needs the console token (bearer or login cookie)")
        return False

    async def _serve_static(self, name: str, writer: asyncio.StreamWriter) -> None:
        kind = STATIC_TYPES.get(Path(name).suffix)
        if kind is None or "/" in name or name.startswith("."):
            raise HttpError(HTTPStatus.NOT_FOUND, "not found")
        try:
            data = _static(name)
        except FileNotFoundError:
            raise HttpError(HTTPStatus.NOT_FOUND, "not found") from None
        await respond(writer, HTTPStatus.OK, data, kind)

    async def _page(self, request: Request, writer: asyncio.StreamWriter) -> None:
        code = request.arg("login")
        if code is not None:
            if self.codes.redeem(code):
                await self._start_session(writer)
            else:
                message = (
                    "That login link was used already (or has expired): get a new one (below), "
                    "or log in with the console token."
                )
                await self._login_page(writer, HTTPStatus.UNAUTHORIZED, message)
        elif request.arg("token") is not None:
            # The token never travels in a URL (history, logs, Referer): only the form takes it.
            message = "Login links carry a one-time code, not the token: type the token here."
            await self._login_page(writer, HTTPStatus.UNAUTHORIZED, message)
        elif self.authorized(request):
            await respond(writer, HTTPStatus.OK, _static("index.html"), HTML, {"Content-Security-Policy": CSP})
        else:
            await self._login_page(writer, HTTPStatus.OK, "")

    async def _login(self, token: str, writer: asyncio.StreamWriter) -> None:
        if token and token_matches(self.config.token, token):
            await self._start_session(writer)
        else:
            await self._login_page(writer, HTTPStatus.UNAUTHORIZED, "That is not the console token.")

    async def _start_session(self, writer: asyncio.StreamWriter) -> None:
        cookie_header = session_cookie(self.cookie, self.sessions.issue(self.port))
        await respond(writer, HTTPStatus.SEE_OTHER, b"", HTML, {"Location": "/", "Set-Cookie": cookie_header})

    async def _login_page(self, writer: asyncio.StreamWriter, status: int, message: str) -> None:
        page = _static("login.html").decode().replace("{{message}}", message)
        await respond(writer, status, page.encode(), HTML, {"Content-Security-Policy": CSP})

    async def _console_api(self, request: Request, rest: list[str], writer: asyncio.StreamWriter) -> None:
        method = request.method
        if rest == ["instances"] and method == "GET":
            await respond_json(writer, HTTPStatus.OK, {"instances": self.views.all()})
            return
        if len(rest) != 3 or rest[0] != "instances":
            raise HttpError(HTTPStatus.NOT_FOUND, "not found")
        instance_id, action = rest[1], rest[2]
        if action == "stream" and method == "GET":
            await self._stream(request, instance_id, writer)
        elif action == "uploads" and method == "POST":
            name, data = _upload_body(await request.body(files.MAX_UPLOAD * 4 // 3 + 4096))
            path, fields = files.save_upload(self.uploads, name, data)
            base = self.cp.http_url or ""
            await respond_json(writer, HTTPStatus.CREATED, {**fields, "url": base + quote(path)})
        elif action == "artifacts" and method == "GET":
            await self._artifact(instance_id, request.arg("event_id") or "", writer)
        else:
            raise HttpError(HTTPStatus.NOT_FOUND, "not found")

    async def _stream(self, request: Request, instance_id: str, writer: asyncio.StreamWriter) -> None:
        raw = request.headers.get("last-event-id") or request.arg("after") or "0"
        try:
            cursor = int(raw)
        except ValueError:
            raise HttpError(HTTPStatus.BAD_REQUEST, "Last-Event-ID / after must be an integer") from None
        stream = InstanceStream(self.cp, self.queries, self.views, instance_id, cursor, writer)
        self._streams.add(stream)
        try:
            await stream.run()
        except ConnectionError:
            pass  # the browser went away (it reconnects with Last-Event-ID)
        finally:
            self._streams.discard(stream)
            stream.close()

    async def _artifact(self, instance_id: str, event_id: str, writer: asyncio.StreamWriter) -> None:
        event = self.queries.event(instance_id, event_id)
        if event is None or event["kind"] != "artifact.produced":
            raise HttpError(HTTPStatus.NOT_FOUND, "no such artifact.produced event")
        payload = event["payload"]
        shown, digest = str(payload.get("path")), str(payload.get("sha256"))
        # A name that is not UTF-8 travels escaped in `path`, its raw bytes in `path_b64` (the driver's
        # docs/protocol.md): the file is opened by its bytes, the download named by the escaped form.
        rel = files.raw_name(payload.get("path_b64")) or shown
        data = files.read_artifact(self.config.artifact_roots.get(instance_id), rel, digest)
        filename = json.dumps(Path(shown).name)  # a quoted-string for Content-Disposition
        await respond(
            writer,
            HTTPStatus.OK,
            data,
            "application/octet-stream",
            {"Content-Disposition": f"attachment; filename={filename}"},
        )


def _upload_body(raw: bytes) -> tuple[str, bytes]:
    """`{"name": N, "data_b64": B}`: a JSON body like every request that changes something."""
    try:
        body = json.loads(raw)
    except ValueError:
        raise HttpError(HTTPStatus.BAD_REQUEST, "body is not JSON") from None
    if not isinstance(body, dict) or not isinstance(body.get("data_b64"), str):
        raise HttpError(HTTPStatus.BAD_REQUEST, 'body must be {"name": ..., "data_b64": ...}')
    name = files.plain_name(body.get("name") if isinstance(body.get("name"), str) else None)
    try:
        data = base64.b64decode(body["data_b64"], validate=True)
    except (binascii.Error, ValueError):
        raise HttpError(HTTPStatus.BAD_REQUEST, "data_b64 is not base64") from None
    if len(data) > files.MAX_UPLOAD:
        raise HttpError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"upload over {files.MAX_UPLOAD} bytes")
    return name, data
