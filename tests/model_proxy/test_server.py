"""The proxy on its own, against the fake model endpoints and a scripted upstream: placeholders
swapped for secrets in the upstream's own header, strangers refused, streams relayed byte for byte
and chunk by chunk, usage measured, budgets enforced in the upstream's error shape."""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import httpx2
import pytest
from agent_lab.testing.fake_anthropic import FakeAnthropic
from agent_lab.testing.fake_responses import FakeResponses

from driver.model_proxy.budget import Exceeded, Ledger
from driver.model_proxy.plan import Route
from driver.model_proxy.server import ModelProxy, UsageRecord
from driver.protocol.boot import Budget
from tests.model_proxy.upstreams import SpacedUpstream, anthropic_stream

SECRET = "sk-ant-REAL-SECRET-0123456789"
OPENAI_SECRET = "sk-openai-REAL-SECRET-9876543210"


@dataclass
class Harness:
    proxy: ModelProxy
    placeholders: dict[str, str]
    usage: list[UsageRecord] = field(default_factory=list)
    exceeded: list[tuple[str | None, Exceeded]] = field(default_factory=list)
    run_id: str | None = "run-1"


@asynccontextmanager
async def proxied(
    routes: dict[str, str], budget: Budget | None = None, secrets: dict[str, str] | None = None
) -> AsyncIterator[Harness]:
    ledger = Ledger(budget or Budget())
    holder: dict[str, Harness] = {}

    async def on_usage(record: UsageRecord) -> None:
        holder["h"].usage.append(record)

    proxy = ModelProxy(
        {name: Route(name, url) for name, url in routes.items()},
        {"ANTHROPIC_API_KEY": SECRET, "OPENAI_API_KEY": OPENAI_SECRET} if secrets is None else secrets,
        ledger,
        current_run=lambda: holder["h"].run_id,
        on_usage=on_usage,
        on_exceeded=lambda run_id, ex: holder["h"].exceeded.append((run_id, ex)),
    )
    h = Harness(proxy, proxy.rotate())
    holder["h"] = h
    await proxy.start()
    try:
        yield h
    finally:
        await proxy.close()


def messages_body(text: str = "[[say:hello there]]", stream: bool = True) -> dict[str, object]:
    return {
        "model": "claude-sonnet-4-5",
        "max_tokens": 100,
        "stream": stream,
        "messages": [{"role": "user", "content": text}],
    }


async def test_anthropic_stream_reaches_the_fake_with_the_real_key_only() -> None:
    with FakeAnthropic() as fake:
        async with proxied({"anthropic": fake.base_url}) as h, httpx2.AsyncClient() as client:
            placeholder = h.placeholders["ANTHROPIC_API_KEY"]
            assert SECRET not in placeholder
            r = await client.post(
                f"{h.proxy.url}/anthropic/v1/messages",
                headers={"x-api-key": placeholder, "anthropic-version": "2023-06-01"},
                json=messages_body(),
            )
            assert r.status_code == 200
            assert "text_delta" in r.text and "event: message_stop" in r.text
            assert fake.request_headers[-1]["x-api-key"] == SECRET
            assert placeholder not in json.dumps(fake.request_headers)
            assert len(h.usage) == 1
            u = h.usage[0]
            assert u.run_id == "run-1" and u.model == "claude-sonnet-4-5"
            assert u.input_tokens > 0 and u.output_tokens > 0
            assert u.request_id and u.request_id.startswith("req_fake_")
            assert u.upstream == fake.base_url
            assert u.cost_usd is not None and u.cost_usd > 0


async def test_responses_api_bearer_swapped_and_usage_read() -> None:
    with FakeResponses() as fake:
        async with proxied({"openai": fake.base_url}) as h, httpx2.AsyncClient() as client:
            placeholder = h.placeholders["OPENAI_API_KEY"]
            body = {"model": "gpt-5.5", "stream": True, "input": [{"role": "user", "content": "[[say:hi]]"}]}
            r = await client.post(
                f"{h.proxy.url}/openai/responses", headers={"authorization": f"Bearer {placeholder}"}, json=body
            )
            assert r.status_code == 200 and "response.completed" in r.text
            assert fake.request_headers[-1]["authorization"] == f"Bearer {OPENAI_SECRET}"
            assert len(h.usage) == 1 and h.usage[0].model == "gpt-5.5"
            assert h.usage[0].input_tokens > 0 and h.usage[0].output_tokens > 0
            assert h.usage[0].cost_usd is not None  # gpt-5.5 is priced by the gpt-5 row


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"x-api-key": "sk-ant-some-other-key-000000"},
        {"x-api-key": SECRET},  # even the real key: the agent must not be able to use one it found
        {"authorization": "Bearer wrong"},
    ],
    ids=["none", "stranger", "the-secret-itself", "wrong-bearer"],
)
async def test_requests_without_the_current_placeholder_are_refused(headers: dict[str, str]) -> None:
    with FakeAnthropic() as fake:
        async with proxied({"anthropic": fake.base_url}) as h, httpx2.AsyncClient() as client:
            r = await client.post(f"{h.proxy.url}/anthropic/v1/messages", headers=headers, json=messages_body())
            assert r.status_code == 401
            assert r.json()["type"] == "error" and r.json()["error"]["type"] == "authentication_error"
            assert SECRET not in r.text and h.placeholders["ANTHROPIC_API_KEY"] not in r.text
            assert fake.requests == [] and h.usage == []


async def test_a_rotated_placeholder_stops_working() -> None:
    with FakeAnthropic() as fake:
        async with proxied({"anthropic": fake.base_url}) as h, httpx2.AsyncClient() as client:
            old = h.placeholders["ANTHROPIC_API_KEY"]
            new = h.proxy.rotate()["ANTHROPIC_API_KEY"]
            assert new != old
            url = f"{h.proxy.url}/anthropic/v1/messages"
            refused = await client.post(url, headers={"x-api-key": old}, json=messages_body())
            served = await client.post(url, headers={"x-api-key": new}, json=messages_body())
            assert (refused.status_code, served.status_code) == (401, 200)
            assert len(fake.requests) == 1


async def test_sse_is_relayed_byte_for_byte_and_chunk_by_chunk() -> None:
    chunks = anthropic_stream()
    gap = 0.15
    async with (
        SpacedUpstream(chunks, gap_s=gap) as upstream,
        proxied({"anthropic": upstream.url}) as h,
        httpx2.AsyncClient() as client,
    ):
        request = client.build_request(
            "POST",
            f"{h.proxy.url}/anthropic/v1/messages",
            headers={"x-api-key": h.placeholders["ANTHROPIC_API_KEY"]},
            json=messages_body(),
        )
        response = await client.send(request, stream=True)
        arrivals: list[tuple[float, bytes]] = []
        async for piece in response.aiter_raw():
            arrivals.append((time.monotonic(), piece))
        await response.aclose()
    assert b"".join(p for _, p in arrivals) == b"".join(chunks)
    # Each spaced chunk arrived on its own, about `gap` after the one before: nothing was held back.
    assert len(arrivals) == len(chunks)
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(arrivals)]
    assert min(gaps) > gap * 0.5, gaps
    assert upstream.received[0].headers["x-api-key"] == SECRET
    assert upstream.received[0].path == "/v1/messages"
    assert len(h.usage) == 1
    assert (h.usage[0].input_tokens, h.usage[0].cached_input_tokens, h.usage[0].output_tokens) == (120, 20, 40)
    assert h.usage[0].request_id == "req_scripted"


async def test_usage_is_reported_before_the_final_event_reaches_the_provider() -> None:
    """The provider can end its turn on message_stop: the usage must already be accounted for then."""
    chunks = anthropic_stream()
    async with (
        SpacedUpstream(chunks, gap_s=0.05) as upstream,
        proxied({"anthropic": upstream.url}) as h,
        httpx2.AsyncClient() as client,
    ):
        seen_at_stop: list[int] = []
        request = client.build_request(
            "POST",
            f"{h.proxy.url}/anthropic/v1/messages",
            headers={"x-api-key": h.placeholders["ANTHROPIC_API_KEY"]},
            json=messages_body(),
        )
        response = await client.send(request, stream=True)
        async for piece in response.aiter_raw():
            if b"message_stop" in piece:
                seen_at_stop.append(len(h.usage))
        await response.aclose()
    assert seen_at_stop == [1]


async def test_json_answer_usage_and_budget_in_tokens() -> None:
    with FakeAnthropic() as fake:
        budget = Budget(max_tokens_per_run=1)
        async with proxied({"anthropic": fake.base_url}, budget) as h, httpx2.AsyncClient() as client:
            url = f"{h.proxy.url}/anthropic/v1/messages"
            headers = {"x-api-key": h.placeholders["ANTHROPIC_API_KEY"]}
            first = await client.post(url, headers=headers, json=messages_body(stream=False))
            assert first.status_code == 200 and first.json()["type"] == "message"
            assert len(h.usage) == 1 and h.usage[0].output_tokens > 0
            second = await client.post(url, headers=headers, json=messages_body())
            assert second.status_code == 429
            assert second.headers["x-should-retry"] == "false"
            error = second.json()
            assert error["type"] == "error" and error["error"]["type"] == "budget.exceeded"
            assert "max_tokens_per_run" in error["error"]["message"]
            assert len(fake.requests) == 1
            assert [(r, e.limit) for r, e in h.exceeded] == [("run-1", "max_tokens_per_run")]
            # Another run starts with its own run budget.
            h.run_id = "run-2"
            third = await client.post(url, headers=headers, json=messages_body())
            assert third.status_code == 200


async def test_session_budget_in_usd_refuses_in_openai_shape() -> None:
    with FakeResponses() as fake:
        budget = Budget(max_usd_per_session=0.0)
        async with proxied({"openai": fake.base_url}, budget) as h, httpx2.AsyncClient() as client:
            h.run_id = None
            r = await client.post(
                f"{h.proxy.url}/openai/responses",
                headers={"authorization": f"Bearer {h.placeholders['OPENAI_API_KEY']}"},
                json={"model": "gpt-5.5", "stream": True, "input": "hi"},
            )
            assert r.status_code == 429
            assert r.json()["error"]["code"] == "budget.exceeded"
            assert fake.requests == []
            assert h.exceeded[0][1].limit == "max_usd_per_session"


async def test_unreachable_upstream_and_unknown_route_are_errors_not_crashes() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"  # bound, not listening: connection refused
        async with proxied({"anthropic": dead}) as h, httpx2.AsyncClient() as client:
            headers = {"x-api-key": h.placeholders["ANTHROPIC_API_KEY"]}
            r = await client.post(f"{h.proxy.url}/anthropic/v1/messages", headers=headers, json=messages_body())
            assert r.status_code == 502 and r.json()["error"]["type"] == "api_error"
            r = await client.post(f"{h.proxy.url}/nowhere/v1/messages", headers=headers, json=messages_body())
            assert r.status_code == 404


async def test_garbage_on_the_socket_gets_400_and_the_proxy_keeps_serving() -> None:
    with FakeAnthropic() as fake:
        async with proxied({"anthropic": fake.base_url}) as h:
            port = int(h.proxy.url.rsplit(":", 1)[1])
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"\x00\x01 NOT HTTP AT ALL\r\n\r\n")
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(), 5)
            writer.close()
            assert answer.startswith(b"HTTP/1.1 400")
            async with httpx2.AsyncClient() as client:
                headers = {"x-api-key": h.placeholders["ANTHROPIC_API_KEY"]}
                r = await client.post(f"{h.proxy.url}/anthropic/v1/messages", headers=headers, json=messages_body())
                assert r.status_code == 200


async def test_keep_alive_connection_serves_several_requests() -> None:
    with FakeAnthropic() as fake:
        async with proxied({"anthropic": fake.base_url}) as h, httpx2.AsyncClient() as client:
            headers = {"x-api-key": h.placeholders["ANTHROPIC_API_KEY"]}
            for _ in range(3):
                r = await client.post(f"{h.proxy.url}/anthropic/v1/messages", headers=headers, json=messages_body())
                assert r.status_code == 200
            assert len(h.usage) == 3 and len(fake.requests) == 3


async def test_with_no_secret_to_withhold_credentials_pass_and_budgets_still_apply() -> None:
    with FakeAnthropic() as fake:
        async with (
            proxied({"anthropic": fake.base_url}, Budget(max_tokens_per_run=1), secrets={}) as h,
            httpx2.AsyncClient() as client,
        ):
            url = f"{h.proxy.url}/anthropic/v1/messages"
            first = await client.post(url, headers={"x-api-key": "sk-own-key-000000"}, json=messages_body())
            second = await client.post(url, headers={"x-api-key": "sk-own-key-000000"}, json=messages_body())
            assert (first.status_code, second.status_code) == (200, 429)
            assert fake.request_headers[-1]["x-api-key"] == "sk-own-key-000000"
            assert len(h.usage) == 1


async def test_an_upstream_cut_mid_answer_closes_the_connection_and_counts_what_was_reported() -> None:
    async with (
        SpacedUpstream(anthropic_stream(), cut_after=3) as upstream,
        proxied({"anthropic": upstream.url}) as h,
        httpx2.AsyncClient() as client,
    ):
        headers = {"x-api-key": h.placeholders["ANTHROPIC_API_KEY"]}
        with pytest.raises(httpx2.HTTPError):
            await client.post(f"{h.proxy.url}/anthropic/v1/messages", headers=headers, json=messages_body())
        # The input as reported; the output was never reported (cut before message_delta): charged
        # as the bytes relayed could hold, at most the request's max_tokens (100), and marked estimated.
        assert len(h.usage) == 1 and h.usage[0].input_tokens == 120 and h.usage[0].output_tokens == 100
        assert h.usage[0].estimated and h.proxy.ledger.run("run-1").output_tokens == 100
        # The proxy serves on.
        upstream.cut_after = None
        r = await client.post(f"{h.proxy.url}/anthropic/v1/messages", headers=headers, json=messages_body())
        assert r.status_code == 200 and len(h.usage) == 2


async def test_expect_100_continue_is_answered() -> None:
    with FakeAnthropic() as fake:
        async with proxied({"anthropic": fake.base_url}) as h:
            body = json.dumps(messages_body(stream=False)).encode()
            reader, writer = await asyncio.open_connection("127.0.0.1", int(h.proxy.url.rsplit(":", 1)[1]))
            head = (
                f"POST /anthropic/v1/messages HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                f"x-api-key: {h.placeholders['ANTHROPIC_API_KEY']}\r\ncontent-length: {len(body)}\r\n"
                "expect: 100-continue\r\nconnection: close\r\n\r\n"
            )
            writer.write(head.encode())
            await writer.drain()
            interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert interim.startswith(b"HTTP/1.1 100")
            writer.write(body)
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(), 10)
            writer.close()
            assert answer.startswith(b"HTTP/1.1 200") and b'"type": "message"' in answer


async def test_a_placeholder_is_refused_on_another_vendors_route() -> None:
    with FakeAnthropic() as anthropic, FakeResponses() as openai:
        async with (
            proxied({"anthropic": anthropic.base_url, "openai": openai.base_url}) as h,
            httpx2.AsyncClient() as client,
        ):
            # The OpenAI placeholder on the Anthropic route, and the Anthropic one on the OpenAI route.
            r1 = await client.post(
                f"{h.proxy.url}/anthropic/v1/messages",
                headers={"x-api-key": h.placeholders["OPENAI_API_KEY"]},
                json=messages_body(),
            )
            r2 = await client.post(
                f"{h.proxy.url}/openai/responses",
                headers={"authorization": f"Bearer {h.placeholders['ANTHROPIC_API_KEY']}"},
                json={"model": "gpt-5.5", "stream": True, "input": "hi"},
            )
            assert (r1.status_code, r2.status_code) == (401, 401)
            assert anthropic.requests == [] and openai.requests == []


@pytest.mark.parametrize(
    "target",
    ["/anthropic//evil.example/v1/messages", "/anthropic/@evil.example/v1/messages", "http://evil.example/v1/messages"],
)
async def test_a_request_target_cannot_change_the_upstream_host(target: str) -> None:
    async with SpacedUpstream(anthropic_stream()) as upstream, proxied({"anthropic": upstream.url}) as h:
        own_host = upstream.url.removeprefix("http://")
        reader, writer = await asyncio.open_connection("127.0.0.1", int(h.proxy.url.rsplit(":", 1)[1]))
        writer.write(
            f"POST {target} HTTP/1.1\r\nhost: x\r\nx-api-key: {h.placeholders['ANTHROPIC_API_KEY']}\r\n"
            "content-length: 2\r\nconnection: close\r\n\r\n{}".encode()
        )
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
    # None of them names a listed endpoint once normalised: refused, nothing sent anywhere.
    assert answer.startswith(b"HTTP/1.1 404") and upstream.received == [] and own_host


async def test_a_burst_of_parallel_requests_is_held_to_the_budget_by_reservations() -> None:
    """8 requests at once under 1500 tokens, each answer really costing ~1100: before issue 30 all 8
    were forwarded (each saw the budget unspent); now each reserves its worst case and the later ones
    wait for the earlier to settle, so two are served and the rest refused budget.exceeded."""
    chunks = anthropic_stream(input_tokens=100, output_tokens=1000)
    async with (
        SpacedUpstream(chunks, gap_s=0.02) as upstream,
        proxied({"anthropic": upstream.url}, Budget(max_tokens_per_run=1500)) as h,
        httpx2.AsyncClient(timeout=30, limits=httpx2.Limits(max_connections=16)) as client,
    ):
        body = {**messages_body(), "max_tokens": 1000}

        async def one() -> int:
            headers = {"x-api-key": h.placeholders["ANTHROPIC_API_KEY"]}
            r = await client.post(f"{h.proxy.url}/anthropic/v1/messages", headers=headers, json=body)
            return r.status_code

        statuses = await asyncio.gather(*(one() for _ in range(8)))
    assert sorted(statuses) == [200, 200] + [429] * 6, statuses
    assert len(upstream.received) == 2
    assert h.proxy.ledger.run("run-1").output_tokens == 2000


async def test_a_chat_stream_is_made_to_report_usage_and_an_unpriced_model_reaches_a_usd_budget() -> None:
    def chat(data: dict[str, object]) -> bytes:
        return f"data: {json.dumps(data)}\n\n".encode()

    chunks = [
        chat({"model": "my-local-model", "choices": [{"delta": {"content": "hi"}}]}),
        chat({"model": "my-local-model", "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 5}}),
        b"data: [DONE]\n\n",
    ]
    async with (
        SpacedUpstream(chunks) as upstream,
        proxied({"openai": upstream.url}, Budget(max_usd_per_run=0.0001)) as h,
        httpx2.AsyncClient() as client,
    ):
        headers = {"authorization": f"Bearer {h.placeholders['OPENAI_API_KEY']}"}
        body = {"model": "my-local-model", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        first = await client.post(f"{h.proxy.url}/openai/chat/completions", headers=headers, json=body)
        second = await client.post(f"{h.proxy.url}/openai/chat/completions", headers=headers, json=body)
    # The client did not ask for usage; the upstream was asked for it.
    assert json.loads(upstream.received[0].body)["stream_options"] == {"include_usage": True}
    assert first.status_code == 200 and h.usage[0].output_tokens == 5
    # Unpriced: charged at the table's highest rates, so the USD budget is reached.
    assert h.usage[0].estimated and h.usage[0].cost_usd is not None and h.usage[0].cost_usd > 0.0001
    assert second.status_code == 429 and len(upstream.received) == 1


@pytest.mark.parametrize("path", ["/v1/messages/batches", "/v1/complete", "/v1/../v1/files", "/v1/messages%2fbatches"])
async def test_what_is_not_a_listed_endpoint_is_refused_and_never_gets_the_key(path: str) -> None:
    async with SpacedUpstream(anthropic_stream()) as upstream, proxied({"anthropic": upstream.url}) as h:
        async with httpx2.AsyncClient() as client:
            r = await client.post(
                f"{h.proxy.url}/anthropic{path}",
                headers={"x-api-key": h.placeholders["ANTHROPIC_API_KEY"]},
                json=messages_body(),
            )
        assert r.status_code == 404 and "error" in r.json()
        assert upstream.received == []
