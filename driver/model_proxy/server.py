"""The loopback proxy itself: h11 on asyncio streams towards the provider, httpx2 towards the upstream.

One connection task per provider connection (keep-alive: many requests each). A request is read
whole (model requests are small next to their answers), checked (route, placeholder, budget), sent
upstream, and the answer is written back chunk by chunk as the upstream's socket yields it: nothing
is buffered on the way, so server-sent events reach the provider byte for byte and as soon as they
arrive. The usage reader sees each chunk first; the one that ends the answer (message_stop,
response.completed, [DONE]) waits until its usage is accounted for, so a `model.usage` always comes
before the provider can end its turn on that answer.

Why h11 + httpx2: both were already in the environment (the mcp SDK's stack, maintained by the
encode/pydantic projects), neither buffers a streamed body, and h11 is a pure parser: the server is
this module and `wire`, with no framework in the hot path. Measured in docs/protocol.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import h11

from driver import logs
from driver.model_proxy import errors, prices, wire
from driver.model_proxy.budget import Exceeded, Ledger
from driver.model_proxy.plan import Route, family_of, new_placeholder
from driver.model_proxy.usage import Dialect, UsageReader, dialect_of

if TYPE_CHECKING:
    import httpx2

log = logs.get("driver.model_proxy")


@dataclass(frozen=True, slots=True)
class UsageRecord:
    """One model request's usage, as `model.usage` carries it (plus the run it belongs to)."""

    run_id: str | None
    upstream: str
    model: str
    input_tokens: int
    output_tokens: int
    cached_input_tokens: int
    cost_usd: float | None
    request_id: str | None

    def payload(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "upstream": self.upstream,
            "model": self.model,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cached_input_tokens": self.cached_input_tokens,
            "cost_usd": self.cost_usd,
            "request_id": self.request_id,
        }


OnUsage = Callable[[UsageRecord], Awaitable[None]]
OnExceeded = Callable[[str | None, Exceeded], None]


class ModelProxy:
    def __init__(
        self,
        routes: dict[str, Route],
        secrets: dict[str, str],
        ledger: Ledger,
        *,
        current_run: Callable[[], str | None],
        on_usage: OnUsage,
        on_exceeded: OnExceeded,
        upstream_timeout_s: float = 30.0,
    ) -> None:
        self.routes = routes
        self._secrets = dict(secrets)
        self.ledger = ledger
        self._current_run = current_run
        self._on_usage = on_usage
        self._on_exceeded = on_exceeded
        self._timeout_s = upstream_timeout_s
        self._placeholders: dict[str, str] = {}  # placeholder -> secret name (the current generation only)
        # Bound now, served from `start()`: the port is known before the first provider is built, and
        # a connection made in between waits in the backlog.
        # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say they are TCP, and
        # without it each small SSE event after the first waits for the client's delayed ACK (~40 ms).
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(128)
        self._sock.setblocking(False)
        self._server: asyncio.Server | None = None
        self._client: httpx2.AsyncClient | None = None
        self._client_ready = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self.refused = {"placeholder": 0, "budget": 0}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}"

    def rotate(self) -> dict[str, str]:
        """A fresh placeholder for every secret (a new provider process); the previous ones stop working."""
        fresh = {name: new_placeholder() for name in self._secrets}
        self._placeholders = {value: name for name, value in fresh.items()}
        return fresh

    async def start(self) -> None:
        """Serve now; the upstream client is built meanwhile (importing httpx2 and loading the TLS roots
        costs ~0.1-0.4 s, which must not delay the provider's spawn: its first model request comes
        later, and waits for the client if it does not)."""
        if self._server is not None:
            return
        self._server = await asyncio.start_server(self._serve_connection, sock=self._sock)
        task = asyncio.get_running_loop().create_task(self._build_client(), name="model-proxy-client")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def ready(self) -> None:
        """Return once the upstream client is built (requests wait for it anyway)."""
        await self._client_ready.wait()

    async def _build_client(self) -> None:
        try:
            self._client = await anyio.to_thread.run_sync(wire.new_client, self._timeout_s)
        except Exception as exc:
            log.error("model_proxy.client_failed", error=f"{type(exc).__name__}: {exc}")
        finally:
            self._client_ready.set()

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        else:
            self._sock.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    # -- one connection -------------------------------------------------------------------------------
    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=64 * 1024)
        try:
            while True:
                got = await wire.read_request(conn, reader, writer)
                if got is None:
                    break
                request, body = got
                await self._handle(conn, writer, request, body)
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    break
                conn.start_next_cycle()
        except (wire.ClientGone, ConnectionError, h11.LocalProtocolError):
            pass
        except asyncio.CancelledError:
            # close(): the connection task ends here (a top-level task of the server, not awaited by
            # anyone who would need the cancellation to propagate).
            pass
        except Exception as exc:  # no input may take the driver down: log and drop the connection
            log.warning("model_proxy.connection_failed", error=f"{type(exc).__name__}: {exc}")
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            if task is not None:
                self._tasks.discard(task)

    async def _handle(
        self, conn: h11.Connection, writer: asyncio.StreamWriter, request: h11.Request, body: bytes
    ) -> None:
        target = request.target.decode("latin-1")
        name, _, rest = target.lstrip("/").partition("/")
        route = self.routes.get(name.split("?", 1)[0])
        path = "/" + rest
        dialect = dialect_of(path)
        shape: Dialect | None = dialect or ("anthropic" if name == "anthropic" else None)
        if route is None:
            await wire.refuse(conn, writer, errors.NOT_FOUND, shape, "no such model route on this proxy")
            return
        headers, secret_ok = self._upstream_headers(request.headers, route)
        if not secret_ok:
            self._count_refusal("placeholder", route)
            await wire.refuse(conn, writer, errors.AUTH, shape, "this proxy needs the current placeholder key")
            return
        run_id = self._current_run()
        if dialect is not None:
            exceeded = self.ledger.exceeded(run_id)
            if exceeded is not None:
                self._count_refusal("budget", route)
                self._on_exceeded(run_id, exceeded)
                await wire.refuse(conn, writer, errors.BUDGET, shape, exceeded.message)
                return
        await self._forward(conn, writer, request, body, route, path, headers, dialect, run_id)

    def _count_refusal(self, reason: str, route: Route) -> None:
        """Counted always, logged for the first ten and every hundredth after: a tool hammering the
        proxy with a wrong key must not flood the driver's log (and its uplink)."""
        self.refused[reason] += 1
        count = self.refused[reason]
        if count <= 10 or count % 100 == 0:
            log.warning("model_proxy.refused", reason=reason, route=route.name, count=count)

    def _upstream_headers(
        self, raw: Iterable[tuple[bytes, bytes]], route: Route
    ) -> tuple[list[tuple[bytes, bytes]], bool]:
        """The headers for the upstream, each placeholder swapped for its secret; False when a credential
        header is missing or carries anything but a current placeholder."""
        out: list[tuple[bytes, bytes]] = []
        seen = False
        for key, value in raw:
            if key in wire.HOP_BY_HOP:
                continue
            if key in wire.CREDENTIAL_HEADERS and self._secrets:
                swapped = self._swap(value, route)
                if swapped is None:
                    return [], False
                seen = True
                value = swapped
            out.append((key, value))
        out.append((b"accept-encoding", b"identity"))  # the usage reader reads what it forwards
        # With no secret to withhold (a payload that wants budgets only), credentials pass as sent.
        return out, seen or not self._secrets

    def _swap(self, value: bytes, route: Route) -> bytes | None:
        text = value.decode("latin-1").strip()
        scheme = ""
        if text[:7].lower() == "bearer ":
            scheme, text = text[:7], text[7:].strip()
        name = self._placeholders.get(text)
        # A key only goes to its own vendor's upstream: an agent cannot send the OpenAI key to the
        # Anthropic route's upstream (or to an OpenAI-compatible gateway) with the other placeholder.
        if name is None or family_of(name) != route.family:
            return None
        return (scheme + self._secrets[name]).encode("latin-1")

    async def _forward(
        self,
        conn: h11.Connection,
        writer: asyncio.StreamWriter,
        request: h11.Request,
        body: bytes,
        route: Route,
        path: str,
        headers: list[tuple[bytes, bytes]],
        dialect: Dialect | None,
        run_id: str | None,
    ) -> None:
        import httpx2

        await self._client_ready.wait()
        client = self._client
        if client is None:
            await wire.refuse(conn, writer, errors.UPSTREAM, dialect, "the proxy has no upstream client")
            return
        started = time.monotonic()
        upstream_request = client.build_request(
            request.method.decode("ascii", "replace"), route.upstream + path, headers=headers, content=body
        )
        try:
            response = await client.send(upstream_request, stream=True)
        except httpx2.HTTPError as exc:
            log.warning("model_proxy.upstream_failed", route=route.name, error=type(exc).__name__)
            await wire.refuse(
                conn, writer, errors.UPSTREAM, dialect, f"the upstream could not be reached ({type(exc).__name__})"
            )
            return
        try:
            await self._relay(conn, writer, response, route, body, dialect, run_id)
        finally:
            await response.aclose()
            log.debug(
                "model_proxy.request",
                route=route.name,
                status=response.status_code,
                ms=round((time.monotonic() - started) * 1000, 1),
            )

    async def _relay(
        self,
        conn: h11.Connection,
        writer: asyncio.StreamWriter,
        response: httpx2.Response,
        route: Route,
        request_body: bytes,
        dialect: Dialect | None,
        run_id: str | None,
    ) -> None:
        import httpx2

        raw_headers = [(k.lower(), v) for k, v in response.headers.raw]
        out_headers = [(k, v) for k, v in raw_headers if k not in wire.HOP_BY_HOP or k == b"content-length"]
        if any(k == b"transfer-encoding" for k, _ in raw_headers):
            out_headers = [(k, v) for k, v in out_headers if k != b"content-length"]
        content_type = response.headers.get("content-type", "")
        streaming = content_type.startswith("text/event-stream")
        reader = UsageReader(dialect, streaming) if dialect is not None and response.status_code < 300 else None
        request_id = response.headers.get("request-id") or response.headers.get("x-request-id")
        await wire.send(
            writer,
            conn.send(
                h11.Response(status_code=response.status_code, headers=out_headers, reason=response.reason_phrase)
            ),
        )
        accounted = False
        held = b""  # a JSON answer's latest chunk, sent once the next one (or its usage) is in
        try:
            async for chunk in response.aiter_raw():
                if not chunk:
                    continue
                if reader is not None and reader.feed(chunk) and not accounted:
                    accounted = True
                    await self._account(reader, route, request_body, request_id, run_id)
                if reader is not None and not streaming:
                    chunk, held = held, chunk
                    if not chunk:
                        continue
                await wire.send(writer, conn.send(h11.Data(data=chunk)))
        except (wire.ClientGone, httpx2.HTTPError) as exc:
            # The provider hung up (an interrupt), or the upstream did mid-answer: what the upstream
            # reported so far still counts. The provider's connection closes (its answer is cut).
            if reader is not None and not accounted:
                reader.close()
                if reader.usage.reported:
                    await self._account(reader, route, request_body, request_id, run_id)
            if isinstance(exc, httpx2.HTTPError):
                log.warning("model_proxy.upstream_cut", route=route.name, error=type(exc).__name__)
                raise wire.ClientGone from exc
            raise
        if reader is not None and not accounted:
            reader.close()
            if reader.usage.reported:
                await self._account(reader, route, request_body, request_id, run_id)
        if held:
            await wire.send(writer, conn.send(h11.Data(data=held)))
        await wire.send(writer, conn.send(h11.EndOfMessage()))

    async def _account(
        self, reader: UsageReader, route: Route, request_body: bytes, request_id: str | None, run_id: str | None
    ) -> None:
        usage = reader.usage
        model = usage.model or _request_model(request_body)
        cost = prices.cost_usd(
            model,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cached_input_tokens=usage.cached_input_tokens,
            cache_write_tokens=usage.cache_write_tokens,
        )
        self.ledger.record(run_id, usage.input_tokens, usage.output_tokens, usage.cached_input_tokens, cost)
        record = UsageRecord(
            run_id=run_id,
            upstream=route.label,
            model=model,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cached_input_tokens=usage.cached_input_tokens,
            cost_usd=cost,
            request_id=request_id,
        )
        try:
            await self._on_usage(record)
        except Exception as exc:
            log.warning("model_proxy.usage_not_reported", error=f"{type(exc).__name__}: {exc}")


def _request_model(body: bytes) -> str:
    import json

    try:
        value = json.loads(body).get("model")
    except (ValueError, AttributeError):
        return ""
    return value if isinstance(value, str) else ""
