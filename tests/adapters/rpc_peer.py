"""A scripted JSON-RPC peer run as a subprocess by the jsonrpc/process tests (our own plumbing, not a
provider mock). It reads newline-delimited requests on stdin and acts on the method name."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

VERSION = os.environ.get("RPC_VERSION") or None


def send(message: dict[str, Any]) -> None:
    if VERSION:
        message = {"jsonrpc": VERSION, **message}
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def read() -> dict[str, Any] | None:
    line = sys.stdin.readline()
    if not line:
        return None
    parsed: dict[str, Any] = json.loads(line)
    return parsed


def await_response(request_id: Any) -> dict[str, Any]:
    """Read until the response to our request `request_id` arrives (requests from the other side are
    not expected meanwhile in these scripts)."""
    while True:
        message = read()
        if message is None:
            sys.exit(3)
        if "method" not in message and message.get("id") == request_id:
            return message


def main() -> None:
    sys.stderr.write(f"peer started token={os.environ.get('FAKE_TOKEN', '')}\n")
    sys.stderr.flush()
    while True:
        message = read()
        if message is None:
            return
        method, params, rid = message.get("method"), message.get("params"), message.get("id")
        if method == "echo":
            send({"id": rid, "result": {"params": params, "raw": message}})
        elif method == "fail":
            send({"id": rid, "error": {"code": -32000, "message": "nope", "data": {"x": 1}}})
        elif method == "ask":
            # Ask the other side with an id that collides with theirs (Codex numbers from 0 too).
            send({"id": params["id"], "method": params["method"], "params": params.get("params")})
            send({"id": rid, "result": await_response(params["id"])})
        elif method == "ask_two":
            # Two requests at once: the first blocks in its handler, the second must still be answered.
            send({"id": "slow", "method": "block", "params": None})
            send({"id": "fast", "method": "quick", "params": None})
            fast = await_response("fast")
            # ACP v1 names the field `requestId`; LSP-style peers say `id`: the caller picks.
            key = (params or {}).get("cancel_key", "id")
            send({"method": CANCEL, "params": {key: "slow"}})
            slow = await_response("slow")
            send({"id": rid, "result": {"fast": fast, "slow": slow}})
        elif method == "ticks":
            for i in range(params["count"]):
                send({"method": "tick", "params": {"i": i}})
            send({"id": rid, "result": "ticked"})
        elif method == "hostile":
            # Write the given raw lines, then collect the `expect` answers they call for.
            for line in params["lines"]:
                sys.stdout.write(line + "\n")
            sys.stdout.flush()
            answers = [read() for _ in range(params["expect"])]
            send({"id": rid, "result": {"answers": answers}})
        elif method == "answer_then_tick":
            # The answer and a notification in one write: the other side reads them in one chunk.
            pair = [{"id": rid, "result": "answered"}, {"method": "tick", "params": {"after": True}}]
            sys.stdout.write("".join(json.dumps({"jsonrpc": VERSION, **m} if VERSION else m) + "\n" for m in pair))
            sys.stdout.flush()
        elif method == "garbage":
            sys.stdout.write("this is not json\n[1, 2]\n")
            sys.stdout.flush()
            send({"id": rid, "result": "after garbage"})
        elif method == "big":
            sys.stdout.write("x" * params["size"] + "\n")
            sys.stdout.flush()
            send({"id": rid, "result": "unreachable"})
        elif method == "exit":
            sys.stderr.write("peer exiting on request\n")
            sys.stderr.flush()
            os._exit(params.get("code", 0) if isinstance(params, dict) else 0)
        elif method == "hang":
            time.sleep(3600)
        elif rid is not None and method is not None:
            send({"id": rid, "error": {"code": -32601, "message": f"unknown {method}"}})


CANCEL = "$/cancel_request"

if __name__ == "__main__":
    main()
