"""The loopback proxy itself: the hardened loopback core (`driver.net.listener`) towards the provider,
httpx2 towards the upstream.

Everything is decided on the request head before a body byte is read (`_decide`): the target is
normalised and must name a route and one of its listed endpoints (`endpoints`), every credential
header must carry a current placeholder bound to that route, and a model endpoint must find its run
and the session within budget and a free slot (`MAX_IN_FLIGHT`). Then the body is read (bounded by the
core), inspected (model, worst-case output; a Chat Completions stream is made to report usage), its
worst case is reserved in the ledger in the same step as the budget check, and it is forwarded. The
answer is written back chunk by chunk as the upstream's socket yields it: nothing is buffered on the
way, so server-sent events reach the provider byte for byte and as soon as they arrive. The usage
reader sees each chunk first; the one that ends the answer (message_stop, response.completed, [DONE])
waits until its usage is charged and reported, so a `model.usage` always comes before the provider
can end its turn on that answer.

Why h11 + httpx2: both were already in the environment (the mcp SDK's stack), neither buffers a
streamed body, and h11 is a pure parser. Measured in docs/protocol.md.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from driver import logs
from driver.model_proxy import endpoints, errors, prices, wire
from driver.model_proxy.budget import Exceeded, Ledger, Ticket
from driver.model_proxy.endpoints import Ask, Endpoint, Target
from driver.model_proxy.plan import Route, family_of, new_placeholder
from driver.model_proxy.usage import Dialect, UsageReader
from driver.net.listener import BodyRefused, ClientGone, Exchange, Handler, Head, Limits, LoopbackServer, Reply

if TYPE_CHECKING:
    import httpx2

log = logs.get("driver.model_proxy")

# Model requests in flight at once (every route together); more are refused 429, retryable.
MAX_IN_FLIGHT = 16
# How long a request waits for the reservations of the requests in flight before a retryable 429.
RESERVATION_WAIT_S = 60.0
LIMITS = Limits(
    max_connections=64, max_per_client=64, max_body_bytes=32 * 1024 * 1024, max_buffered_bytes=96 * 1024 * 1024
)


@dataclass(frozen=True, slots=True)
class UsageRecord:
    """One model request's usage, as `model.usage` carries it (plus the run it belongs to)."""

    run_id: str | None  # the run it belongs to (§6.7 attribution), open or ended
    upstream: str
    model: str
    input_tokens: int
    output_tokens: int
    cached_input_tokens: int
    cost_usd: float | None
    request_id: str | None
    estimated: bool = False  # figures or cost are the proxy's conservative charge, not the upstream's report
    charged_to_run: bool = True  # False: charged to the session only (outside a run, or after its end)

    def payload(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "run_id": self.run_id,
            "upstream": self.upstream,
            "model": self.model,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cached_input_tokens": self.cached_input_tokens,
            "cost_usd": self.cost_usd,
            "request_id": self.request_id,
        }
        if self.estimated:
            out["estimated"] = True
        return out


OnUsage = Callable[[UsageRecord], Awaitable[None]]
OnExceeded = Callable[[str | None, Exceeded], None]


class Attribution(Protocol):
    """Which run a connection's requests belong to, from the process that holds its client socket
    (PROTOCOL §6.7 "Attribution"; the kernel's side is `room.ProxyRoom`)."""

    async def identify(self, client_port: int, server_port: int) -> object:
        """Once per connection: who holds the client end (None: not found, today's rule applies)."""
        ...

    def ended_run(self, origin: object) -> str | None:
        """Per request: the run, now ended, during which the origin's process was started; None when
        the request follows the run active now."""
        ...


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
        bindings: Mapping[str, frozenset[str]] | None = None,
        attribution: Attribution | None = None,
        upstream_timeout_s: float = 30.0,
        limits: Limits = LIMITS,
        port: int = 0,
    ) -> None:
        self.routes = routes
        self._secrets = dict(secrets)
        # secret name -> the routes it may be sent to (PROTOCOL §9: a secret only to its own routes).
        self._bindings = dict(bindings) if bindings is not None else _family_bindings(routes, secrets)
        self.ledger = ledger
        self._current_run = current_run
        self._on_usage = on_usage
        self._on_exceeded = on_exceeded
        self._attribution = attribution
        self._timeout_s = upstream_timeout_s
        self._placeholders: dict[str, str] = {}  # placeholder -> secret name (the current generation only)
        # A kept provider's generation (driver/model_proxy/kept.py): keyed digest -> secret name.
        self._kept: dict[str, str] = {}
        self._kept_digest: Callable[[str], str] | None = None
        # Bound now, served from `start()`: the port is known before the first provider is built, and
        # a connection made in between waits in the backlog. `port`: the one a kept provider calls.
        self._server = LoopbackServer(
            self._decide,
            name="model_proxy",
            limits=limits,
            error_body=self._error_body,
            identify=self._identify if attribution is not None else None,
        )
        try:
            self._server.bind(port)
        except OSError as exc:
            if not port:
                raise
            log.warning("model_proxy.port_taken", port=port, error=exc.strerror or type(exc).__name__)
            self._server.bind(0)
        self._client: httpx2.AsyncClient | None = None
        self._client_ready = anyio.Event()
        self._client_task: Any = None
        self.in_flight = 0
        self._changed = anyio.Event()  # set (and replaced) whenever a reservation is settled or released
        self.refused = {"placeholder": 0, "budget": 0, "endpoint": 0, "busy": 0}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.port}"

    @property
    def listener(self) -> LoopbackServer:
        return self._server

    def rotate(self) -> dict[str, str]:
        """A fresh placeholder for every secret (a new provider process); the previous ones stop working."""
        fresh = {name: new_placeholder() for name in self._secrets}
        self._placeholders = {value: name for name, value in fresh.items()}
        return fresh

    def keep(self, digests: Mapping[str, str], digest: Callable[[str], str]) -> None:
        """Accept a kept provider's placeholders too (their keyed digests) beside the current ones."""
        self._kept = dict(digests)
        self._kept_digest = digest

    def drop_kept(self) -> None:
        """The kept provider is gone: only the current generation works from now on."""
        self._kept = {}
        self._kept_digest = None

    async def start(self) -> None:
        """Serve now; the upstream client is built meanwhile (importing httpx2 and loading the TLS roots
        costs ~0.1-0.4 s, which must not delay the provider's spawn: its first model request comes
        later, and waits for the client if it does not)."""
        import asyncio

        if self._client_task is not None:
            return
        await self._server.start()
        self._client_task = asyncio.get_running_loop().create_task(self._build_client(), name="model-proxy-client")

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
        await self._server.close()
        task, self._client_task = self._client_task, None
        if task is not None and not task.done():
            task.cancel()
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def _identify(self, client_port: int) -> object:
        assert self._attribution is not None
        return await self._attribution.identify(client_port, self._server.port)

    # -- the head: route, endpoint, credential, budget -----------------------------------------------
    @staticmethod
    def _error_body(status: int, message: str, head: Head | None) -> bytes:
        shape: Dialect | None = None
        if head is not None and head.target.startswith("/anthropic/"):
            shape = "anthropic"
        return errors.body((status, *errors.KIND_NAMES.get(status, errors.BAD_REQUEST[1:])), shape, message)[1]

    def _decide(self, head: Head) -> Reply | Handler:
        target = endpoints.normalise(head.target)
        route = self.routes.get(target.route) if target is not None else None
        if target is None or route is None:
            return _refusal(errors.NOT_FOUND, None, "no such model route on this proxy")
        shape: Dialect = "anthropic" if route.family == "anthropic" else "responses"
        endpoint = endpoints.match(route.family, head.method, target.path)
        if endpoint is None:
            self._count_refusal("endpoint", route)
            return _refusal(errors.NOT_FOUND, shape, f"{head.method} {target.path} is not forwarded by this proxy")
        headers = self._upstream_headers(head.headers, route)
        if headers is None:
            self._count_refusal("placeholder", route)
            return _refusal(errors.AUTH, shape, "this proxy needs the current placeholder key")
        if endpoint.dialect is None:
            return lambda exchange: self._serve(exchange, route, target, endpoint, headers, None, shape)
        # A process a run started, calling after that run ended, spends for the session (never for the
        # run active now); every other request belongs to the run active now.
        ended = self._attribution.ended_run(head.origin) if self._attribution is not None else None
        run_id = ended if ended is not None else self._current_run()
        exceeded = self.ledger.after_end(ended) if ended is not None else self.ledger.exceeded(run_id)
        if exceeded is None and ended is not None:
            exceeded = self.ledger.exceeded(None)  # the session's budget
        if exceeded is not None:
            self._count_refusal("budget", route)
            self._on_exceeded(run_id, exceeded)
            return _refusal(errors.BUDGET, shape, exceeded.message)
        if self.in_flight >= MAX_IN_FLIGHT:
            self._count_refusal("busy", route)
            return _refusal(errors.BUSY, shape, f"more than {MAX_IN_FLIGHT} model requests in flight")
        self.in_flight += 1  # taken here, on the head: given back when the handler ends
        return lambda exchange: self._serve(exchange, route, target, endpoint, headers, run_id, shape)

    def _count_refusal(self, reason: str, route: Route) -> None:
        """Counted always, logged for the first ten and every hundredth after: a tool hammering the
        proxy must not flood the driver's log (and its uplink)."""
        self.refused[reason] += 1
        count = self.refused[reason]
        if count <= 10 or count % 100 == 0:
            log.warning("model_proxy.refused", reason=reason, route=route.name, count=count)

    def _upstream_headers(self, raw: Iterable[tuple[bytes, bytes]], route: Route) -> list[tuple[bytes, bytes]] | None:
        """The headers for the upstream, each placeholder swapped for its secret; None when a credential
        header is missing or carries anything but a current placeholder bound to this route."""
        out: list[tuple[bytes, bytes]] = []
        seen = False
        for key, value in raw:
            if key in wire.HOP_BY_HOP:
                continue
            if key in wire.CREDENTIAL_HEADERS and self._secrets:
                swapped = self._swap(value, route)
                if swapped is None:
                    return None
                seen = True
                value = swapped
            out.append((key, value))
        out.append((b"accept-encoding", b"identity"))  # the usage reader reads what it forwards
        # With no secret to withhold (a payload that wants budgets only), credentials pass as sent.
        return out if seen or not self._secrets else None

    def _swap(self, value: bytes, route: Route) -> bytes | None:
        text = value.decode("latin-1").strip()
        scheme = ""
        if text[:7].lower() == "bearer ":
            scheme, text = text[:7], text[7:].strip()
        name = self._placeholders.get(text)
        if name is None and self._kept_digest is not None and text:
            name = self._kept.get(self._kept_digest(text))
        if name is None or route.name not in self._bindings.get(name, frozenset()):
            return None
        return (scheme + self._secrets[name]).encode("latin-1")

    # -- the body, the reservation, the upstream ----------------------------------------------------
    async def _serve(
        self,
        exchange: Exchange,
        route: Route,
        target: Target,
        endpoint: Endpoint,
        headers: list[tuple[bytes, bytes]],
        run_id: str | None,
        shape: Dialect,
    ) -> None:
        ticket: Ticket | None = None
        try:
            body = await exchange.body()
            ask: Ask | None = None
            if endpoint.dialect is not None:
                try:
                    ask = endpoints.inspect(endpoint.dialect, body)
                except endpoints.BadRequest as exc:
                    await exchange.reply(_refusal(errors.BAD_REQUEST, shape, str(exc)))
                    return
                body = ask.body
                usd, _ = prices.charge_usd(
                    ask.model, input_tokens=ask.input_estimate, output_tokens=ask.max_output_tokens
                )
                admitted = await self._admit(run_id, ask.input_estimate + ask.max_output_tokens, usd)
                if isinstance(admitted, Exceeded):
                    self._count_refusal("budget", route)
                    if admitted.reserved:
                        await exchange.reply(_refusal(errors.BUSY, shape, admitted.message))
                    else:
                        self._on_exceeded(run_id, admitted)
                        await exchange.reply(_refusal(errors.BUDGET, shape, admitted.message))
                    return
                ticket = admitted
            await self._forward(exchange, route, target, endpoint, headers, body, ask, ticket, shape)
        finally:
            if endpoint.dialect is not None:
                self.in_flight -= 1
            if ticket is not None:
                self.ledger.release(ticket)  # nothing charged (a failure): the reservation is freed
                self._ledger_changed()

    async def _admit(self, run_id: str | None, tokens: int, usd: float) -> Ticket | Exceeded:
        """Admit and reserve in one step; while only other requests' reservations stand in the way,
        wait (at most RESERVATION_WAIT_S) for them to settle, then decide on what they really spent:
        a burst is served one reservation at a time, and the budget is never overshot by more than
        about one request."""
        deadline = time.monotonic() + RESERVATION_WAIT_S
        while True:
            admitted = self.ledger.admit(run_id, tokens, usd)
            left = deadline - time.monotonic()
            if not isinstance(admitted, Exceeded) or not admitted.reserved or left <= 0:
                return admitted
            changed = self._changed
            with anyio.move_on_after(left):
                await changed.wait()

    def _ledger_changed(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def _forward(
        self,
        exchange: Exchange,
        route: Route,
        target: Target,
        endpoint: Endpoint,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        ask: Ask | None,
        ticket: Ticket | None,
        shape: Dialect,
    ) -> None:
        import httpx2

        await self._client_ready.wait()
        client = self._client
        if client is None:
            await exchange.reply(_refusal(errors.UPSTREAM, shape, "the proxy has no upstream client"))
            return
        started = time.monotonic()
        url = route.upstream + target.path + (f"?{target.query}" if target.query else "")
        upstream_request = client.build_request(endpoint.method, url, headers=headers, content=body)
        try:
            response = await client.send(upstream_request, stream=True)
        except httpx2.HTTPError as exc:
            log.warning("model_proxy.upstream_failed", route=route.name, error=type(exc).__name__)
            message = f"the upstream could not be reached ({type(exc).__name__})"
            await exchange.reply(_refusal(errors.UPSTREAM, shape, message))
            return
        try:
            await self._relay(exchange, response, route, ask, ticket, endpoint.dialect)
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
        exchange: Exchange,
        response: httpx2.Response,
        route: Route,
        ask: Ask | None,
        ticket: Ticket | None,
        dialect: Dialect | None,
    ) -> None:
        import httpx2

        raw_headers = [(k.lower(), v) for k, v in response.headers.raw]
        out_headers = [(k, v) for k, v in raw_headers if k not in wire.HOP_BY_HOP or k == b"content-length"]
        if any(k == b"transfer-encoding" for k, _ in raw_headers):
            out_headers = [(k, v) for k, v in out_headers if k != b"content-length"]
        streaming = response.headers.get("content-type", "").startswith("text/event-stream")
        ok = response.status_code < 300
        reader = UsageReader(dialect, streaming) if dialect is not None and ok else None
        request_id = response.headers.get("request-id") or response.headers.get("x-request-id")
        charge = _Charge(self, route, ask, ticket, request_id)
        await exchange.respond(response.status_code, out_headers, response.reason_phrase.encode("latin-1", "replace"))
        held = b""  # a JSON answer's latest chunk, sent once the next one (or its usage) is in
        try:
            async for chunk in response.aiter_raw():
                if not chunk:
                    continue
                charge.relayed += len(chunk)
                if reader is not None and reader.feed(chunk) and not charge.done:
                    await charge.account(reader, complete=True)
                if reader is not None and not streaming:
                    chunk, held = held, chunk
                    if not chunk:
                        continue
                await exchange.send(chunk)
        except (ClientGone, httpx2.HTTPError) as exc:
            # The provider hung up (an interrupt), or the upstream did mid-answer: what was spent still
            # counts (what the upstream reported, else a conservative estimate).
            if reader is not None and not charge.done:
                reader.close()
                await charge.account(reader, complete=False)
            if isinstance(exc, httpx2.HTTPError):
                log.warning("model_proxy.upstream_cut", route=route.name, error=type(exc).__name__)
                raise ClientGone from exc
            raise
        if reader is not None and not charge.done:
            reader.close()
            await charge.account(reader, complete=reader.finished)
        if held:
            await exchange.send(held)
        await exchange.end()


class _Charge:
    """Settling one model request's reservation from what its answer reported."""

    def __init__(
        self, proxy: ModelProxy, route: Route, ask: Ask | None, ticket: Ticket | None, request_id: str | None
    ) -> None:
        self.proxy = proxy
        self.route = route
        self.ask = ask
        self.ticket = ticket
        self.request_id = request_id
        self.relayed = 0
        self.done = False

    async def account(self, reader: UsageReader, *, complete: bool) -> None:
        """Charge the request: the upstream's figures when it reported them in a complete answer; else
        (no usage, or a cut answer) the reported input and an output no smaller than the bytes relayed
        could hold (4 bytes a token, at most the request's worst case), marked `estimated`."""
        self.done = True
        ticket, ask = self.ticket, self.ask
        if ticket is None or ask is None:
            return
        usage = reader.usage
        estimated = not (complete and usage.reported)
        input_tokens = usage.input_tokens if usage.reported else ask.input_estimate
        output_tokens = usage.output_tokens
        if estimated:
            output_tokens = max(output_tokens, min(ask.max_output_tokens, self.relayed // 4))
        model = usage.model or ask.model
        cost, priced = prices.charge_usd(
            model,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cached_input_tokens=usage.cached_input_tokens,
            cache_write_tokens=usage.cache_write_tokens,
        )
        charged = self.proxy.ledger.settle(ticket, input_tokens, output_tokens, usage.cached_input_tokens, cost)
        self.proxy._ledger_changed()
        record = UsageRecord(
            run_id=ticket.run_id,
            upstream=self.route.label,
            model=model,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cached_input_tokens=usage.cached_input_tokens,
            cost_usd=cost,
            request_id=self.request_id,
            estimated=estimated or not priced,
            charged_to_run=charged,
        )
        try:
            await self.proxy._on_usage(record)
        except Exception as exc:
            log.warning("model_proxy.usage_not_reported", error=f"{type(exc).__name__}: {exc}")


def _family_bindings(routes: Mapping[str, Route], secrets: Mapping[str, str]) -> dict[str, frozenset[str]]:
    """Without a plan's bindings (a proxy built alone): each secret on its vendor family's routes."""
    return {n: frozenset(r for r, route in routes.items() if route.family == family_of(n)) for n in secrets}


def _refusal(kind: errors.Kind, shape: Dialect | None, message: str) -> Reply:
    status, payload = errors.body(kind, shape, message)
    headers = [(b"content-type", b"application/json"), (b"x-should-retry", b"true" if status == 503 else b"false")]
    if kind is errors.BUSY:
        headers = [(b"content-type", b"application/json"), (b"x-should-retry", b"true"), (b"retry-after", b"1")]
    return Reply(status, payload, headers)


__all__ = ["Attribution", "BodyRefused", "ModelProxy", "UsageRecord"]
