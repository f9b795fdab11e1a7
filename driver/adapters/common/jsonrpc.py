"""A newline-delimited JSON-RPC peer over a pair of byte streams (a provider's stdin/stdout).

Shared by Codex app-server (which omits the "jsonrpc" field) and ACP agents ("jsonrpc": "2.0").
Both sides send requests: our request ids and the peer's live in independent spaces (Codex numbers its
own from 0, so they collide with ours), so a message is routed by its shape, never by its id: one with a
"method" comes from the peer (a request if it has an "id", else a notification); anything else is a
response to one of ours.

Concurrency: `run()` is the read loop and owns a task group in which every incoming request is handled
in its own task, so a handler that waits for a human (a permission) never blocks the reading of the
next line. Notifications are handled inline, in arrival order (streamed deltas must stay ordered), so a
notification handler should be quick; it may await backpressure. Writes are serialized with a lock.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
import msgspec

from driver import logs, tasks

log = logs.get(__name__)

METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
INVALID_REQUEST = -32600
REQUEST_CANCELLED = -32800
CANCEL_METHOD = "$/cancel_request"

RequestHandler = Callable[[str, Any], Awaitable[Any]]
# Told of each protocol violation by the peer, with a description that never quotes the peer's bytes.
ViolationHandler = Callable[[str], Awaitable[None]]
NotificationHandler = Callable[[str, Any], Awaitable[None]]
HandlerErrorHandler = Callable[[str, Exception], Awaitable[None]]  # (method, the handler's exception)
RequestId = int | str
# Told, inline in the read loop, of a request a predecessor already answered, met again in the output a
# reattached driver re-reads (PROTOCOL §8.2): (id, method, params). It is not answered again.
ReplayedHandler = Callable[[RequestId, str, Any], Awaitable[None]]
# Told, inline in the read loop, of the answer to a predecessor's request this peer adopted: the
# response message ({"result": ...} or {"error": ...}).
AdoptedHandler = Callable[[dict[str, Any]], Awaitable[None]]


class JsonRpcError(Exception):
    """An error answer: raised by `request()` when the peer answers one, and raised by an `on_request`
    handler to answer the peer with one."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(f"{message} (code {code})")
        self.code = code
        self.message = message
        self.data = data


class PeerClosed(Exception):
    """The peer's stream ended (or was closed for a protocol violation) before an answer arrived."""


@dataclass(slots=True)
class _Pending:
    done: anyio.Event = field(default_factory=anyio.Event)
    result: Any = None
    error: BaseException | None = None
    on_answer: Callable[[Any], None] | None = None


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()


class JsonRpcPeer:
    def __init__(
        self,
        reader: anyio.abc.ByteReceiveStream,
        writer: anyio.abc.ByteSendStream,
        *,
        name: str,
        jsonrpc_version: str | None,
        max_line_bytes: int = 64 * 1024 * 1024,
        on_request: RequestHandler | None = None,
        on_notification: NotificationHandler | None = None,
        on_violation: ViolationHandler | None = None,
        on_handler_error: HandlerErrorHandler | None = None,
        first_id: int = 0,
        answered: frozenset[RequestId] = frozenset(),
        on_replayed: ReplayedHandler | None = None,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self.name = name
        self._version = jsonrpc_version
        self._max_line = max_line_bytes
        self._on_request = on_request
        self._on_notification = on_notification
        self._on_violation = on_violation
        self._on_handler_error = on_handler_error  # told of a handler's unexpected error (a diagnostic)
        self._write_lock = anyio.Lock()
        # A driver reattached to a running provider (PROTOCOL §8.2) re-reads output its predecessor
        # read: answers to the predecessor's requests (ids below `first_id`) are not ours and not
        # violations, and requests the predecessor answered (`answered`) are not answered twice.
        self._next_id = first_id
        self._first_id = first_id
        self._answered = answered
        self._on_replayed = on_replayed
        self._adopted: dict[RequestId, AdoptedHandler] = {}
        self._pending: dict[RequestId, _Pending] = {}
        self._incoming: dict[RequestId, anyio.CancelScope] = {}
        self.closed = anyio.Event()
        # Why the peer closed: None while open; "eof" on a clean end; a message after a violation.
        self.close_reason: str | None = None
        self.invalid_lines = 0
        self.unknown_responses = 0

    # -- sending -------------------------------------------------------------------------------

    def _envelope(self) -> dict[str, Any]:
        return {"jsonrpc": self._version} if self._version is not None else {}

    async def _send(self, message: dict[str, Any]) -> None:
        data = _encoder.encode(message) + b"\n"
        async with self._write_lock:
            if self.closed.is_set():
                raise PeerClosed(f"{self.name}: peer closed ({self.close_reason})")
            try:
                await self._writer.send(data)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
                raise PeerClosed(f"{self.name}: cannot write: {type(exc).__name__}") from exc

    async def request(
        self,
        method: str,
        params: Any = None,
        *,
        extra: dict[str, Any] | None = None,
        on_sent: Callable[[], None] | None = None,
        on_answer: Callable[[Any], None] | None = None,
    ) -> Any:
        """Send a request and wait for its answer. Raises JsonRpcError for an error answer and
        PeerClosed if the peer goes away first. `extra`: more top-level fields (Codex's `trace`);
        `on_sent`: called once the request is written (the peer has it), before the answer;
        `on_answer`: called with a successful result inline in the read loop, before the line after
        the answer is dispatched (the waiter resumes only later, after lines already read)."""
        if self.closed.is_set():
            raise PeerClosed(f"{self.name}: peer closed ({self.close_reason})")
        request_id = self._next_id
        self._next_id += 1
        pending = _Pending(on_answer=on_answer)
        self._pending[request_id] = pending
        message = self._envelope() | (extra or {}) | {"id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        try:
            await self._send(message)
            if on_sent is not None:
                on_sent()
            await pending.done.wait()
        finally:
            self._pending.pop(request_id, None)
        if pending.error is not None:
            raise pending.error
        return pending.result

    def adopt(self, request_id: RequestId, on_answer: AdoptedHandler) -> None:
        """Take over a request a predecessor sent (its id below `first_id`): its answer, when read,
        goes to `on_answer`, inline and in stream order (so what it derives keeps its place among the
        notifications around it). Call before `run()` reads: the answer may already be in the log."""
        self._adopted[request_id] = on_answer

    async def notify(self, method: str, params: Any = None) -> None:
        message = self._envelope() | {"method": method}
        if params is not None:
            message["params"] = params
        await self._send(message)

    # -- receiving -----------------------------------------------------------------------------

    async def run(self) -> None:
        """Read and dispatch until EOF (or a line over the limit). Then every pending request fails
        with PeerClosed, running handlers are cancelled, and `closed` is set. Never raises for bad
        input from the peer."""
        try:
            async with tasks.within("jsonrpc peer") as tg:
                try:
                    await self._read_loop(tg)
                finally:
                    # Handlers of a closed peer cannot answer anyone.
                    tg.cancel_scope.cancel()
        finally:
            self._close(self.close_reason or "eof")

    def _close(self, reason: str) -> None:
        if self.close_reason is None or self.close_reason == "eof":
            self.close_reason = reason
        self.closed.set()
        for pending in list(self._pending.values()):
            if not pending.done.is_set():
                pending.error = PeerClosed(f"{self.name}: peer closed ({self.close_reason})")
                pending.done.set()

    async def _read_loop(self, tg: tasks.Tasks) -> None:
        buffer = bytearray()
        scan_from = 0
        while True:
            newline = buffer.find(b"\n", scan_from)
            if newline < 0:
                if len(buffer) > self._max_line:
                    self.close_reason = f"line exceeds the {self._max_line}-byte limit"
                    log.error("jsonrpc.line_too_long", peer=self.name, limit=self._max_line)
                    return
                scan_from = len(buffer)
                try:
                    chunk = await self._reader.receive()
                except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                    if buffer.strip():
                        await self._dispatch_line(bytes(buffer), tg)
                    self.close_reason = "eof"
                    return
                buffer += chunk
                continue
            line = bytes(buffer[:newline])
            del buffer[: newline + 1]
            scan_from = 0
            if len(line) > self._max_line:
                self.close_reason = f"line exceeds the {self._max_line}-byte limit"
                log.error("jsonrpc.line_too_long", peer=self.name, limit=self._max_line)
                return
            if line.strip():
                await self._dispatch_line(line, tg)

    async def _dispatch_line(self, line: bytes, tg: tasks.Tasks) -> None:
        try:
            message = _decoder.decode(line)
        except (msgspec.DecodeError, RecursionError):  # RecursionError: nested ~1000 levels deep
            message = None
        if not isinstance(message, dict):
            self.invalid_lines += 1
            log.warning("jsonrpc.invalid_line", peer=self.name, count=self.invalid_lines, head=line[:200])
            await self._violation(f"a line that is not a JSON object ({len(line)} bytes)")
            return
        method = message.get("method")
        if isinstance(method, str):
            if "id" in message and message["id"] is not None:
                if _usable_id(message["id"]) and message["id"] in self._answered:
                    log.debug("jsonrpc.request_already_answered", peer=self.name, method=method)
                    if self._on_replayed is not None:
                        await self._replayed(message["id"], method, message.get("params"))
                    return
                if not self._start_handler(message["id"], method, message.get("params"), tg):
                    await self._violation("a request whose id is neither a string nor an integer")
            elif method == CANCEL_METHOD:
                self._cancel_incoming(message.get("params"))
            else:
                await self._handle_notification(method, message.get("params"))
        elif "id" in message and ("result" in message or "error" in message):
            adopted = self._adopted.pop(message["id"], None) if _usable_id(message["id"]) else None
            if adopted is not None:
                await self._adopted_answer(adopted, message)
            elif not self._resolve(message):
                await self._violation("a response to a request id that was never sent or already answered")
        else:
            self.invalid_lines += 1
            log.warning("jsonrpc.unroutable", peer=self.name, head=line[:200])
            await self._violation("a message that is neither a request, a notification nor a response")

    async def _replayed(self, request_id: RequestId, method: str, params: Any) -> None:
        assert self._on_replayed is not None
        try:
            await self._on_replayed(request_id, method, params)
        except Exception as exc:
            log.exception("jsonrpc.replayed_handler_failed", peer=self.name, method=method)
            await self._handler_failed(method, exc)

    async def _adopted_answer(self, handler: AdoptedHandler, message: dict[str, Any]) -> None:
        try:
            await handler(message)
        except Exception as exc:
            log.exception("jsonrpc.adopted_handler_failed", peer=self.name)
            await self._handler_failed("(answer)", exc)

    async def _violation(self, what: str) -> None:
        if self._on_violation is None:
            return
        try:
            await self._on_violation(what)
        except Exception:
            log.exception("jsonrpc.violation_handler_failed", peer=self.name)

    def _resolve(self, message: dict[str, Any]) -> bool:
        # Our ids are ints: an id of any other JSON type (object, array, float, bool, null) answers
        # nothing of ours, and an object or array is not even hashable.
        rid = message["id"]
        pending = self._pending.get(rid) if _usable_id(rid) else None
        if pending is None and isinstance(rid, int) and not isinstance(rid, bool) and rid < self._first_id:
            return True  # a predecessor's request, answered in the output we re-read
        if pending is None or pending.done.is_set():
            self.unknown_responses += 1
            log.warning("jsonrpc.unknown_response", peer=self.name, id_type=type(rid).__name__)
            return False
        error = message.get("error")
        if error is not None:
            if isinstance(error, dict):
                code = error.get("code")
                pending.error = JsonRpcError(
                    code if isinstance(code, int) else INTERNAL_ERROR,
                    str(error.get("message", "")),
                    error.get("data"),
                )
            else:
                pending.error = JsonRpcError(INTERNAL_ERROR, str(error))
        else:
            pending.result = message.get("result")
            if pending.on_answer is not None:
                try:
                    pending.on_answer(pending.result)
                except Exception:
                    log.exception("jsonrpc.answer_handler_failed", peer=self.name)
        pending.done.set()
        return True

    async def _handle_notification(self, method: str, params: Any) -> None:
        if self._on_notification is None:
            return
        try:
            await self._on_notification(method, params)
        except Exception as exc:
            # A bug in one handler must not kill the connection to the provider.
            log.exception("jsonrpc.notification_handler_failed", peer=self.name, method=method)
            await self._handler_failed(method, exc)

    async def _handler_failed(self, method: str, exc: Exception) -> None:
        if self._on_handler_error is None:
            return
        try:
            await self._on_handler_error(method, exc)
        except Exception:
            log.exception("jsonrpc.handler_error_report_failed", peer=self.name, method=method)

    def cancel_incoming(self, request_id: RequestId) -> None:
        """Stop handling a request of the peer's that the peer no longer waits for (no answer needed)."""
        self._cancel_incoming({"requestId": request_id})

    def _cancel_incoming(self, params: Any) -> None:
        # ACP v1 names the cancelled request `requestId`; LSP-style peers use `id`. Accept both.
        target = params.get("requestId", params.get("id")) if isinstance(params, dict) else None
        if isinstance(target, int | str):
            scope = self._incoming.get(target)
            if scope is not None:
                scope.cancel()

    def _start_handler(self, request_id: Any, method: str, params: Any, tg: tasks.Tasks) -> bool:
        if not _usable_id(request_id):
            # JSON-RPC 2.0 §5: a request whose id cannot be echoed is answered Invalid Request, id null.
            self.invalid_lines += 1
            log.warning("jsonrpc.bad_request_id", peer=self.name, id_type=type(request_id).__name__)
            error = {"code": INVALID_REQUEST, "message": "invalid request id (a string or an integer is required)"}
            tg.spawn(self._reply_quietly, self._envelope() | {"id": None, "error": error})
            return False
        scope = anyio.CancelScope()
        self._incoming[request_id] = scope
        tg.spawn(self._handle_request, request_id, method, params, scope)
        return True

    async def _handle_request(self, request_id: RequestId, method: str, params: Any, scope: anyio.CancelScope) -> None:
        reply: dict[str, Any]
        try:
            with scope:
                reply = {"result": await self._call_handler(method, params)}
            if scope.cancelled_caught:
                reply = {"error": {"code": REQUEST_CANCELLED, "message": "request cancelled"}}
        except JsonRpcError as exc:
            reply = {"error": {"code": exc.code, "message": exc.message}}
            if exc.data is not None:
                reply["error"]["data"] = exc.data
        except Exception as exc:
            log.exception("jsonrpc.request_handler_failed", peer=self.name, method=method)
            reply = {"error": {"code": INTERNAL_ERROR, "message": f"internal error: {type(exc).__name__}"}}
            await self._handler_failed(method, exc)
        finally:
            self._incoming.pop(request_id, None)
        try:
            await self._send(self._envelope() | {"id": request_id, **reply})
        except PeerClosed:
            log.debug("jsonrpc.reply_dropped", peer=self.name, method=method)

    async def _reply_quietly(self, message: dict[str, Any]) -> None:
        try:
            await self._send(message)
        except PeerClosed:
            log.debug("jsonrpc.reply_dropped", peer=self.name)

    async def _call_handler(self, method: str, params: Any) -> Any:
        if self._on_request is None:
            raise JsonRpcError(METHOD_NOT_FOUND, f"method not found: {method}")
        return await self._on_request(method, params)


def _usable_id(value: Any) -> bool:
    """A request id we can key on and echo: a string, or an integer (not a bool)."""
    return isinstance(value, int | str) and not isinstance(value, bool)
