"""The proxy's pure parts: the usage reader, the price table, the budget ledger, the per-runtime plan."""

from __future__ import annotations

import json

import msgspec
import pytest

from driver.model_proxy import endpoints, plan, prices
from driver.model_proxy.budget import Exceeded, Ledger, Ticket
from driver.model_proxy.usage import UsageReader, dialect_of
from driver.protocol.boot import BOOT_DECODER, Budget, ExecutionConfig
from tests.model_proxy.upstreams import anthropic_stream


def sse(kind: str, data: dict[str, object]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode()


# -- usage -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [1, 3, 7, 64, 100_000])
def test_anthropic_usage_whatever_the_chunking(size: int) -> None:
    stream = b"".join(anthropic_stream(input_tokens=100, output_tokens=40))
    reader = UsageReader("anthropic", streaming=True)
    finished_at = None
    for i in range(0, len(stream), size):
        if reader.feed(stream[i : i + size]) and finished_at is None:
            finished_at = i
    u = reader.close()
    assert (u.model, u.input_tokens, u.cached_input_tokens, u.output_tokens) == ("claude-sonnet-4-5", 120, 20, 40)
    # The end is seen in the chunk holding message_stop, the stream's last event.
    assert finished_at is not None and finished_at + size >= len(stream) - len(
        sse("message_stop", {"type": "message_stop"})
    )


def test_responses_usage_from_completed_with_crlf_framing() -> None:
    usage = {"input_tokens": 50, "input_tokens_details": {"cached_tokens": 30}, "output_tokens": 7}
    events = [
        sse("response.created", {"type": "response.created", "response": {"model": "gpt-5.5"}}),
        sse("response.output_text.delta", {"type": "response.output_text.delta", "delta": "usage"}),
        sse("response.completed", {"type": "response.completed", "response": {"model": "gpt-5.5", "usage": usage}}),
    ]
    stream = b"".join(events).replace(b"\n", b"\r\n")
    reader = UsageReader("responses", streaming=True)
    assert reader.feed(stream) is True
    u = reader.usage
    assert (u.model, u.input_tokens, u.cached_input_tokens, u.output_tokens) == ("gpt-5.5", 50, 30, 7)


def test_chat_completions_usage_then_done() -> None:
    chunk = {"model": "gpt-4o-mini", "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4}}
    reader = UsageReader("chat", streaming=True)
    assert reader.feed(f"data: {json.dumps(chunk)}\n\n".encode()) is False
    assert reader.feed(b"data: [DONE]\n\n") is True
    assert (reader.usage.input_tokens, reader.usage.output_tokens) == (9, 4)


def test_json_answer_read_at_its_end_and_garbage_ignored() -> None:
    body = {"model": "claude-haiku-4-5", "usage": {"input_tokens": 10, "output_tokens": 2}}
    reader = UsageReader("anthropic", streaming=False)
    assert reader.feed(json.dumps(body).encode()) is False
    assert reader.close().output_tokens == 2
    bad = UsageReader("anthropic", streaming=True)
    bad.feed(b"data: {not json\n\ndata: \xff\xfe\n\n")
    assert bad.close().reported is False


def test_a_stream_with_no_event_boundary_is_bounded() -> None:
    reader = UsageReader("anthropic", streaming=True)
    for _ in range(80):
        reader.feed(b"x" * 65536)  # 5 MiB without a blank line: dropped, not kept
    assert reader.close().reported is False


def test_dialect_by_path() -> None:
    assert dialect_of("/v1/messages?beta=true") == "anthropic"
    assert dialect_of("/v1/responses") == "responses"
    assert dialect_of("/chat/completions") == "chat"
    assert dialect_of("/v1/messages/count_tokens") is None
    assert dialect_of("/v1/models") is None


# -- prices ------------------------------------------------------------------------------------------


def test_prices_longest_prefix_and_unknown_models() -> None:
    assert prices.price_of("claude-sonnet-4-5-20250929") == prices.PRICES["claude-sonnet-4"]
    assert prices.price_of("claude-opus-4-5") == prices.PRICES["claude-opus-4-5"]
    assert prices.price_of("gpt-5-mini-2025-08-07") == prices.PRICES["gpt-5-mini"]
    assert prices.price_of("gpt-50") is None  # a prefix must end at a separator
    assert prices.cost_usd("my-local-model", input_tokens=10, output_tokens=10) is None


def test_cost_prices_cached_and_written_tokens_at_their_rates() -> None:
    # claude-sonnet-4: 3 in, 15 out, 0.3 cached, 3.75 cache write (USD per million).
    cost = prices.cost_usd(
        "claude-sonnet-4-5",
        input_tokens=1_000_000,
        output_tokens=100_000,
        cached_input_tokens=500_000,
        cache_write_tokens=100_000,
    )
    assert cost == pytest.approx(0.4 * 3 + 0.5 * 0.3 + 0.1 * 3.75 + 0.1 * 15)


# -- budget ------------------------------------------------------------------------------------------


def spend(ledger: Ledger, run_id: str | None, i: int, o: int, cost: float) -> None:
    ticket = ledger.admit(run_id, 0, 0.0)
    assert not isinstance(ticket, Exceeded)
    ledger.settle(ticket, i, o, 0, cost)


def test_budget_limits_each_reached_then_refused() -> None:
    ledger = Ledger(Budget(max_usd_per_run=1.0, max_tokens_per_run=100, max_usd_per_session=1.7))
    assert ledger.exceeded("r1") is None
    spend(ledger, "r1", 50, 49, 0.5)
    assert ledger.exceeded("r1") is None
    spend(ledger, "r1", 1, 0, 0.1)
    assert ledger.exceeded("r1").limit == "max_tokens_per_run"  # type: ignore[union-attr]
    spend(ledger, "r2", 1, 1, 1.0)
    assert ledger.exceeded("r2").limit == "max_usd_per_run"  # type: ignore[union-attr]
    assert ledger.exceeded("r3") is None
    spend(ledger, "r3", 1, 1, 0.2)
    assert ledger.exceeded("r3").limit == "max_usd_per_session"  # type: ignore[union-attr]
    assert ledger.exceeded(None).limit == "max_usd_per_session"  # type: ignore[union-attr]
    spent = ledger.run("r1").as_usage()
    assert spent == {
        "input_tokens": 51,
        "output_tokens": 49,
        "cached_input_tokens": 0,
        "cost_usd": pytest.approx(0.6),
        "model_requests": 2,
    }


def test_a_burst_sees_the_reservations_of_the_requests_in_flight() -> None:
    """Check and reserve are one step: of 8 requests admitted at once under a budget one request's
    worst case fills, one goes through; the others are told to retry (reserved), and a request that
    fails frees its reservation."""
    ledger = Ledger(Budget(max_tokens_per_run=1000))
    tickets = [ledger.admit("r", 1200, 0.0) for _ in range(8)]
    admitted = [t for t in tickets if isinstance(t, Ticket)]
    assert len(admitted) == 1
    assert all(isinstance(t, Exceeded) and t.reserved for t in tickets[1:])
    ledger.release(admitted[0])
    again = ledger.admit("r", 1200, 0.0)
    assert isinstance(again, Ticket)
    ledger.settle(again, 900, 300, 0, 0.0)
    used = ledger.admit("r", 1, 0.0)
    assert isinstance(used, Exceeded) and not used.reserved and used.limit == "max_tokens_per_run"


def test_after_its_run_closed_a_request_is_charged_to_the_session() -> None:
    ledger = Ledger(Budget(max_usd_per_session=10.0))
    late = ledger.admit("r1", 10, 0.01)
    early = ledger.admit("r1", 10, 0.01)
    assert isinstance(late, Ticket) and isinstance(early, Ticket)
    assert ledger.settle(early, 5, 5, 0, 0.5) is True
    usage = ledger.close_run("r1")
    assert ledger.settle(late, 7, 7, 0, 0.7) is False  # ended after the terminal: the session's
    assert usage["input_tokens"] == 5 and ledger.run("r1").as_usage() == usage
    assert ledger.session.cost_usd == pytest.approx(1.2)
    after = ledger.admit("r1", 1, 0.0)  # a request admitted for a closed run is the session's
    assert isinstance(after, Ticket) and after.run_id == "r1"  # named (the payload's run_id), not held
    assert "r1" not in ledger.held_runs
    assert ledger.settle(after, 1, 1, 0, 0.0) is False and ledger.run("r1").as_usage() == usage


def test_a_process_of_an_ended_run_is_refused_under_a_per_run_budget_only() -> None:
    ledger = Ledger(Budget(max_usd_per_session=10.0))
    assert ledger.after_end("r1") is None  # no per-run budget: the session's budget alone applies
    for budget in (Budget(max_usd_per_run=1.0), Budget(max_tokens_per_run=100)):
        refused = Ledger(budget).after_end("r1")
        assert isinstance(refused, Exceeded) and not refused.reserved
        assert refused.limit == ("max_usd_per_run" if budget.max_usd_per_run else "max_tokens_per_run")


def test_unpriced_models_are_charged_at_the_tables_highest_rates() -> None:
    cost, priced = prices.charge_usd("my-local-model", input_tokens=1_000_000, output_tokens=1_000_000)
    top_in = max(p.input for p in prices.PRICES.values())
    top_out = max(p.output for p in prices.PRICES.values())
    assert priced is False and cost == pytest.approx(top_in + top_out)
    assert prices.charge_usd("claude-sonnet-4-5", input_tokens=1_000_000, output_tokens=0) == (3.0, True)


# -- endpoints ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "route", "path"),
    [
        ("/anthropic/v1/messages?beta=true", "anthropic", "/v1/messages"),
        ("/anthropic/v1/messages#x", "anthropic", "/v1/messages"),
        ("/anthropic//v1//messages/", "anthropic", "/v1/messages"),
        ("/anthropic/v1/x/../messages", "anthropic", "/v1/messages"),
        ("/anthropic/v1/%2e%2e/v1/messages/batches", "anthropic", "/v1/messages/batches"),
        ("/openai/./responses", "openai", "/responses"),
    ],
)
def test_targets_are_normalised_before_matching(target: str, route: str, path: str) -> None:
    t = endpoints.normalise(target)
    assert t is not None and (t.route, t.path) == (route, path)


@pytest.mark.parametrize(
    "target", ["http://evil/v1/messages", "/anthropic/v1%2fmessages", "/..", "/a/%00", "/a\\b", "*", "/", "/a/%ff"]
)
def test_odd_targets_are_refused(target: str) -> None:
    assert endpoints.normalise(target) is None


def test_only_listed_endpoints_are_forwarded() -> None:
    assert endpoints.match("anthropic", "POST", "/v1/messages") is not None
    for method, path in (
        ("POST", "/v1/messages/batches"),
        ("POST", "/v1/complete"),
        ("GET", "/v1/messages"),
        ("POST", "/v1/files"),
    ):
        assert endpoints.match("anthropic", method, path) is None
    assert endpoints.match("openai", "POST", "/embeddings") is None
    assert endpoints.match("openai", "POST", "/batches") is None
    assert endpoints.match("openai", "POST", "/chat/completions") is not None


def test_inspect_forces_usage_on_a_chat_stream_and_reads_the_worst_case() -> None:
    body = json.dumps({"model": "gpt-4o", "stream": True, "max_tokens": 50, "n": 2, "stream_options": {"x": 1}})
    ask = endpoints.inspect("chat", body.encode())
    assert json.loads(ask.body)["stream_options"] == {"x": 1, "include_usage": True}
    assert ask.max_output_tokens == 100 and ask.model == "gpt-4o"
    plain = endpoints.inspect("responses", b'{"model": "gpt-5", "input": "hi"}')
    assert plain.max_output_tokens == endpoints.DEFAULT_MAX_OUTPUT
    assert plain.body == b'{"model": "gpt-5", "input": "hi"}'
    with pytest.raises(endpoints.BadRequest):
        endpoints.inspect("anthropic", b"[1, 2]")
    # Nested past the decoder's depth: a clear 400, not a RecursionError that drops the connection.
    with pytest.raises(endpoints.BadRequest, match="nested too deep"):
        endpoints.inspect("anthropic", b'{"x":' + b"[" * 5000 + b"]" * 5000 + b"}")
    # A field of the wrong type, however large, is read as absent (its first byte decides).
    odd = endpoints.inspect("anthropic", b'{"model": [1, 2], "max_tokens": true, "messages": []}')
    assert odd.model == "" and odd.max_output_tokens == endpoints.DEFAULT_MAX_OUTPUT


# -- plan --------------------------------------------------------------------------------------------


def execution(**fields: object) -> ExecutionConfig:
    base: dict[str, object] = {"revision": "r", "runtime": "claude-agent-sdk"}
    return msgspec.convert({**base, **fields}, ExecutionConfig)


def test_routes_use_the_payload_upstreams_else_the_vendors() -> None:
    ex = execution(environment={"ANTHROPIC_API_KEY": "k" * 10}, model_proxy={"secrets": ["ANTHROPIC_API_KEY"]})
    routes = plan.routes(ex)
    assert routes["anthropic"].upstream == plan.ANTHROPIC_VENDOR and routes["openai"].upstream == plan.OPENAI_VENDOR
    ex = execution(
        runtime="openai-app-server",
        environment={"OPENAI_BASE_URL": "http://up.example:81/v1/", "K": "secret-value"},
        provider_options={"base_url": "https://gw.example/v1"},
        model_proxy={"secrets": ["K"]},
    )
    routes = plan.routes(ex)
    assert (
        routes["openai"].upstream == "http://up.example:81/v1" and routes["codex"].upstream == "https://gw.example/v1"
    )
    with pytest.raises(plan.PlanError):
        plan.routes(execution(environment={"ANTHROPIC_BASE_URL": "file:///etc"}))


def test_route_label_never_carries_credentials() -> None:
    assert plan.Route("x", "https://user:pw@gw.example:8443/v1?key=1").label == "https://gw.example:8443/v1"


def test_provider_environment_withholds_each_secret_under_any_name() -> None:
    secrets = {"ANTHROPIC_API_KEY": "sk-real-0123456789"}
    placeholders = {"ANTHROPIC_API_KEY": plan.new_placeholder()}
    env = {"ANTHROPIC_API_KEY": "sk-real-0123456789", "COPY": "sk-real-0123456789", "PATH": "/bin"}
    out = plan.provider_environment(env, secrets, placeholders, "http://127.0.0.1:9")
    assert "sk-real-0123456789" not in json.dumps(out)
    assert out["ANTHROPIC_API_KEY"] == out["COPY"] == placeholders["ANTHROPIC_API_KEY"]
    assert out["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:9/anthropic"
    assert out["OPENAI_BASE_URL"] == "http://127.0.0.1:9/openai" and out["PATH"] == "/bin"


def test_provider_execution_points_codex_and_acp_at_the_proxy() -> None:
    secrets = {"K": "sk-real-0123456789"}
    placeholders = {"K": "ph"}
    ex = execution(
        runtime="openai-app-server",
        environment={"K": "sk-real-0123456789"},
        provider_options={"base_url": "https://gw.example/v1", "env_key": "K"},
        model_proxy={"secrets": ["K"]},
    )
    out = plan.provider_execution(ex, secrets, placeholders, "http://127.0.0.1:9")
    assert out.provider_options["base_url"] == "http://127.0.0.1:9/codex" and out.provider_options["env_key"] == "K"
    assert out.environment == {"K": "ph"}
    acp = execution(
        runtime="acp",
        environment={"K": "sk-real-0123456789"},
        acp={
            "command": ["agent"],
            "env": {"K": "sk-real-0123456789", "ANTHROPIC_BASE_URL": "http://u", "CODEX_HOME": "/h"},
        },
        model_proxy={"secrets": ["K"]},
    )
    out = plan.provider_execution(acp, secrets, placeholders, "http://127.0.0.1:9", codex_home="/proxied")
    assert out.acp is not None
    assert out.acp.env == {"K": "ph", "ANTHROPIC_BASE_URL": "http://127.0.0.1:9/anthropic", "CODEX_HOME": "/proxied"}


def test_codex_home_config_rewritten_line_by_line() -> None:
    text = (
        "[model_providers.a]\nbase_url = \"http://one/v1\"\n[model_providers.b]\n  base_url = 'http://two/v1'  # note\n"
    )
    out = plan.rewrite_codex_config(text, "P")
    assert 'base_url = "P"' in out and '  base_url = "P"  # note' in out and "http://" not in out


def test_each_secret_is_bound_to_its_own_routes() -> None:
    codex = execution(
        runtime="openai-app-server",
        environment={"OPENAI_API_KEY": "a" * 10, "GW_KEY": "b" * 10, "OTHER": "c" * 10, "ANTHROPIC_API_KEY": "d" * 10},
        provider_options={"base_url": "https://gw.example/v1", "env_key": "GW_KEY"},
        model_proxy={"secrets": ["OPENAI_API_KEY", "GW_KEY", "OTHER", "ANTHROPIC_API_KEY"]},
    )
    assert plan.bindings(codex, ["OPENAI_API_KEY", "GW_KEY", "OTHER", "ANTHROPIC_API_KEY"]) == {
        "OPENAI_API_KEY": frozenset({"openai"}),
        "GW_KEY": frozenset({"codex"}),
        "OTHER": frozenset({"openai"}),
        "ANTHROPIC_API_KEY": frozenset({"anthropic"}),
    }
    assert set(plan.routes(codex)) == {"anthropic", "openai", "codex"}


def test_boot_refuses_a_secret_that_is_not_in_the_environment() -> None:
    payload = {
        "protocol": 1,
        "driver_instance_id": "i",
        "control": {"url": "ws://x", "token": "t"},
        "session": {"id": "s", "agent_id": "a", "kind": "cattle", "cwd": "/c", "state_dir": "/s"},
        "execution": {
            "revision": "r",
            "runtime": "claude-agent-sdk",
            "model_proxy": {"secrets": ["ANTHROPIC_API_KEY"]},
        },
    }
    with pytest.raises(msgspec.ValidationError, match=r"model_proxy\.secrets"):
        BOOT_DECODER.decode(json.dumps(payload))


def test_the_proxy_is_not_imported_without_model_proxy() -> None:
    import subprocess
    import sys

    code = (
        "import sys, driver.cli, driver.kernel.core, driver.kernel.rooms, driver.kernel.provider;"
        "print(sorted(m for m in sys.modules if m.startswith(('driver.model_proxy', 'httpx2'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


# -- the run's end -----------------------------------------------------------------------------------


async def test_settle_budget_wins_unless_a_cancel_came_first_and_usage_is_the_proxys() -> None:
    from driver.adapters.common.base import ProviderError, TurnOutcome
    from driver.kernel.runs import Run
    from driver.model_proxy.room import settle

    spent = {"input_tokens": 7, "output_tokens": 3, "cached_input_tokens": 0, "cost_usd": None, "model_requests": 1}
    reply = TurnOutcome("completed", usage={"input_tokens": 999})
    run = Run("r", "c")
    assert settle(run, reply, None, spent) == (TurnOutcome("completed", usage=spent), None)
    run.forced_error = ProviderError("budget.exceeded", "max_tokens_per_run", details={"limit": "max_tokens_per_run"})
    assert settle(run, reply, None, spent) == (None, run.forced_error)
    assert settle(run, TurnOutcome("cancelled"), None, spent) == (None, run.forced_error)
    run.cancel_requested_by = "user"  # the CP's cancel came first: the cancel stays the terminal
    assert settle(run, TurnOutcome("cancelled"), None, spent) == (TurnOutcome("cancelled"), None)
    other = Run("r2", "c")
    other.forced_error = ProviderError("provider.unresponsive", "quiet")
    assert settle(other, None, None, spent) == (None, None)  # not ours: the run path handles it


@pytest.mark.parametrize(
    "fields",
    [
        {"environment": {"K": "v", "ANTHROPIC_BASE_URL": "file:///etc/passwd"}},
        {"environment": {"K": "v", "OPENAI_BASE_URL": "ftp://x"}},
        {"runtime": "openai-app-server", "environment": {"K": "v"}, "provider_options": {"base_url": 7}},
    ],
)
def test_boot_refuses_an_upstream_the_proxy_cannot_call(fields: dict[str, object]) -> None:
    execution = {"revision": "r", "runtime": "claude-agent-sdk", "model_proxy": {"secrets": ["K"]}, **fields}
    payload = {
        "protocol": 1,
        "driver_instance_id": "i",
        "control": {"url": "ws://x", "token": "t"},
        "session": {"id": "s", "agent_id": "a", "kind": "cattle", "cwd": "/c", "state_dir": "/s"},
        "execution": execution,
    }
    with pytest.raises(msgspec.ValidationError, match=r"must be http\(s\) URLs"):
        BOOT_DECODER.decode(json.dumps(payload))
