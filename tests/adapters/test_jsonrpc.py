"""JsonRpcPeer against a scripted peer subprocess (tests/adapters/rpc_peer.py) over real pipes."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from driver.adapters.common.jsonrpc import JsonRpcError, JsonRpcPeer, PeerClosed
from driver.adapters.common.process import ProviderProcess

PEER = str(Path(__file__).with_name("rpc_peer.py"))


class Harness:
    def __init__(self, process: ProviderProcess, peer: JsonRpcPeer) -> None:
        self.process = process
        self.peer = peer
        self.notifications: list[tuple[str, Any]] = []


@asynccontextmanager
async def _open(
    version: str | None,
    on_request: Any = None,
    max_line_bytes: int = 64 * 1024 * 1024,
    on_handler_error: Any = None,
) -> AsyncIterator[Harness]:
    env = {"RPC_VERSION": version or "", "PATH": "/usr/bin:/bin"}
    process = await ProviderProcess.spawn([sys.executable, PEER], env=env, cwd=Path.cwd(), name="rpc-peer")
    holder: list[Harness] = []

    async def on_notification(method: str, params: Any) -> None:
        holder[0].notifications.append((method, params))

    peer = JsonRpcPeer(
        process.stdout,
        process.stdin,
        name="rpc-peer",
        jsonrpc_version=version,
        max_line_bytes=max_line_bytes,
        on_request=on_request,
        on_notification=on_notification,
        on_handler_error=on_handler_error,
    )
    harness = Harness(process, peer)
    holder.append(harness)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(peer.run)
            yield harness
            await process.terminate(grace=1.0)
    finally:
        await process.terminate(grace=1.0)


async def test_request_response_without_jsonrpc_field() -> None:
    async with _open(None) as h:
        with anyio.fail_after(10):
            result = await h.peer.request("echo", {"a": 1})
        assert result["params"] == {"a": 1}
        assert "jsonrpc" not in result["raw"]
        assert result["raw"]["id"] == 0


async def test_jsonrpc_field_when_versioned() -> None:
    async with _open("2.0") as h:
        with anyio.fail_after(10):
            result = await h.peer.request("echo")
        assert result["raw"]["jsonrpc"] == "2.0"
        assert "params" not in result["raw"]


async def test_error_answer_raises() -> None:
    async with _open(None) as h:
        with anyio.fail_after(10), pytest.raises(JsonRpcError) as info:
            await h.peer.request("fail")
        assert (info.value.code, info.value.message, info.value.data) == (-32000, "nope", {"x": 1})


async def test_peer_request_with_colliding_id_is_routed_by_shape() -> None:
    seen: list[tuple[str, Any]] = []

    async def on_request(method: str, params: Any) -> Any:
        seen.append((method, params))
        if method == "approve":
            return {"decision": "accept"}
        raise JsonRpcError(-32001, "refused", {"why": "test"})

    async with _open(None, on_request) as h:
        with anyio.fail_after(10):
            # Our request gets id 0 and the peer's request uses id 0 too.
            answer = await h.peer.request("ask", {"id": 0, "method": "approve", "params": {"k": "v"}})
            assert answer == {"id": 0, "result": {"decision": "accept"}}
            answer = await h.peer.request("ask", {"id": "str-id", "method": "other"})
            assert answer["id"] == "str-id"
            assert answer["error"] == {"code": -32001, "message": "refused", "data": {"why": "test"}}
        assert seen == [("approve", {"k": "v"}), ("other", None)]


async def test_unknown_method_without_handler_is_method_not_found() -> None:
    async with _open(None) as h:
        with anyio.fail_after(10):
            answer = await h.peer.request("ask", {"id": 7, "method": "whatever"})
        assert answer["id"] == 7
        assert answer["error"]["code"] == -32601


@pytest.mark.parametrize("cancel_key", ["id", "requestId"])
async def test_blocked_handler_does_not_block_reads_and_cancel_request_answers_32800(cancel_key: str) -> None:
    blocked = anyio.Event()

    async def on_request(method: str, params: Any) -> Any:
        if method == "block":
            blocked.set()
            await anyio.sleep_forever()
        return "quick answer"

    async with _open(None, on_request) as h:
        with anyio.fail_after(10):
            answer = await h.peer.request("ask_two", {"cancel_key": cancel_key})
        assert blocked.is_set()
        assert answer["fast"] == {"id": "fast", "result": "quick answer"}
        assert answer["slow"]["id"] == "slow"
        assert answer["slow"]["error"]["code"] == -32800


async def test_notifications_arrive_in_order() -> None:
    async with _open(None) as h:
        with anyio.fail_after(10):
            assert await h.peer.request("ticks", {"count": 50}) == "ticked"
        assert [p["i"] for m, p in h.notifications if m == "tick"] == list(range(50))


async def test_invalid_lines_are_counted_not_fatal() -> None:
    async with _open(None) as h:
        with anyio.fail_after(10):
            assert await h.peer.request("garbage") == "after garbage"
            assert await h.peer.request("echo", 1) is not None
        assert h.peer.invalid_lines == 2
        assert not h.peer.closed.is_set()


async def test_line_over_limit_closes_with_clear_error() -> None:
    async with _open(None, max_line_bytes=1000) as h:
        with anyio.fail_after(10), pytest.raises(PeerClosed, match="1000-byte limit"):
            await h.peer.request("big", {"size": 5000})
        assert h.peer.closed.is_set()
        with pytest.raises(PeerClosed):
            await h.peer.request("echo")


async def test_pending_request_fails_when_peer_exits() -> None:
    async with _open(None) as h:
        with anyio.fail_after(10), pytest.raises(PeerClosed, match="eof"):
            await h.peer.request("exit", {"code": 4})
        with anyio.fail_after(10):
            assert await h.process.wait() == 4
        assert "peer exiting on request" in h.process.stderr_tail()


async def test_concurrent_requests_are_matched_by_id() -> None:
    async with _open(None) as h:
        results: dict[int, Any] = {}

        async def one(i: int) -> None:
            results[i] = (await h.peer.request("echo", {"i": i}))["params"]["i"]

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                for i in range(20):
                    tg.start_soon(one, i)
        assert results == {i: i for i in range(20)}


async def test_ids_of_every_json_type_and_deep_nesting_do_not_stop_the_reader() -> None:
    """A provider may send any JSON as an id, or nest a line 1000 deep (issue 11): requests with an
    unusable id are answered `Invalid Request` with id null, responses to ids we never used are counted
    and dropped, and the reader keeps reading."""
    huge = 2**70
    bad_ids = ['{"a": 1}', "[1]", "1.5", "true"]
    lines = [
        *(f'{{"id": {i}, "result": 1}}' for i in [*bad_ids, "null", str(huge), '"nobody"', "7"]),
        *(f'{{"id": {i}, "method": "m"}}' for i in bad_ids),
        f'{{"id": {huge}, "method": "m"}}',
        '{"method": "$/cancel_request", "params": {"requestId": {"a": [1]}}}',
        "[" * 1000 + "]" * 1000,
        '{"method": "n", "params": ' + "[" * 1000 + "]" * 1000 + "}",
    ]
    async with _open("2.0") as h:
        with anyio.fail_after(20):
            result = await h.peer.request("hostile", {"lines": lines, "expect": 5})
            answers = result["answers"]
            invalid = [a for a in answers if a["error"]["code"] == -32600]
            assert len(invalid) == 4 and all(a["id"] is None for a in invalid)
            (method_not_found,) = [a for a in answers if a["error"]["code"] == -32601]
            assert method_not_found["id"] == huge
            assert (await h.peer.request("echo", 1))["params"] == 1
        assert not h.peer.closed.is_set()
        assert h.peer.invalid_lines >= 4 + 2  # the bad ids, the two deep lines
        assert h.peer.unknown_responses == 8


async def test_a_handler_that_raises_is_answered_and_reported() -> None:
    """The supervision boundary of a port (driver.guard.PortErrors): the provider gets an error answer,
    the driver a diagnostic, at most `limit` of them."""
    from driver.guard import PortErrors

    emitted: list[dict[str, Any]] = []

    async def emit(kind: str, payload: dict[str, Any]) -> None:
        emitted.append(payload)

    async def on_request(method: str, params: Any) -> Any:
        raise KeyError("a port's bug")

    reporter = PortErrors(emit, "rpc-peer", limit=1)
    async with _open(None, on_request, on_handler_error=reporter) as h:
        with anyio.fail_after(10):
            first = await h.peer.request("ask", {"id": 1, "method": "fs/read"})
            second = await h.peer.request("ask", {"id": 2, "method": "fs/read"})
    assert first["error"]["code"] == second["error"]["code"] == -32603
    assert "KeyError" in first["error"]["message"]
    [diag] = emitted  # the second is logged only
    assert diag["code"] == "driver.internal_error"
    assert diag["details"]["exception_type"] == "KeyError" and diag["details"]["method"] == "fs/read"
    assert reporter.count == 2


async def test_on_answer_runs_before_the_lines_read_with_the_answer() -> None:
    """A notification read in the same chunk as an answer is dispatched before the requester resumes:
    `on_answer` is how a requester acts on the answer first (an ACP session id)."""
    seen: list[tuple[Any, list[tuple[str, Any]]]] = []
    async with _open("2.0") as h:

        def on_answer(result: Any) -> None:
            seen.append((result, list(h.notifications)))

        assert await h.peer.request("answer_then_tick", on_answer=on_answer) == "answered"
        assert seen == [("answered", [])]
        assert h.notifications == [("tick", {"after": True})]  # already dispatched when the request returned
