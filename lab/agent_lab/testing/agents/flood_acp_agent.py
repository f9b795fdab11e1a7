"""A tiny ACP agent that floods the driver with a known, countable stream of events.

Usage: `python flood_acp_agent.py`. A prompt containing `[[flood:N:MS]]` makes it send N steps, MS
milliseconds apart (0: as fast as it can); each step `i` is one `plan` update whose single entry reads
`step i` (a lossless `plan.updated` event, which also closes the open message, a lossless
`message.completed`) followed by one `agent_message_chunk` `chunk i;` (a lossless `message.started`
and a best-effort `message.delta`). A prompt without the marker gets a one-chunk reply. It honours
`session/cancel` between steps.

Because step numbers are in the payloads, a test can check the stored history for holes and
duplicates without trusting the driver's seq numbering. Used by the fault suite and the benchmarks;
dependency-free so it starts fast.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
import uuid
from typing import Any

_out_lock = threading.Lock()
# With FLOOD_PROGRESS_FILE set, the number of steps written to stdout so far is kept in that file, so a
# reader can count what the agent emitted even after the driver (and this agent) were SIGKILLed.
_PROGRESS = (
    os.open(os.environ["FLOOD_PROGRESS_FILE"], os.O_WRONLY | os.O_CREAT, 0o600)
    if os.environ.get("FLOOD_PROGRESS_FILE")
    else None
)
_cancelled: dict[str, threading.Event] = {}


def send(message: dict[str, Any]) -> None:
    message["jsonrpc"] = "2.0"
    line = json.dumps(message) + "\n"
    with _out_lock:
        sys.stdout.write(line)
        sys.stdout.flush()


def update(session_id: str, body: dict[str, Any]) -> None:
    send({"method": "session/update", "params": {"sessionId": session_id, "update": body}})


def run_prompt(rid: Any, params: dict[str, Any]) -> None:
    session_id = params["sessionId"]
    cancelled = _cancelled.setdefault(session_id, threading.Event())
    cancelled.clear()
    text = "".join(b.get("text", "") for b in params.get("prompt", []) if b.get("type") == "text")
    # The newest marker counts: a replayed transcript (PROTOCOL §8) carries earlier prompts before it.
    found = list(re.finditer(r"\[\[flood:(\d+)(?::(\d+))?\]\]", text))
    m = found[-1] if found else None
    stop = "end_turn"
    if m is None:
        update(session_id, {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "flood ok"}})
    else:
        steps, delay = int(m.group(1)), int(m.group(2) or 0) / 1000
        for i in range(steps):
            if cancelled.is_set():
                stop = "cancelled"
                break
            update(session_id, {"sessionUpdate": "plan", "entries": [{"content": f"step {i}", "status": "pending"}]})
            if _PROGRESS is not None:
                os.pwrite(_PROGRESS, f"{i + 1:>12}".encode(), 0)  # steps written so far (the evidence command)
            chunk = {"type": "text", "text": f"chunk {i};"}
            update(session_id, {"sessionUpdate": "agent_message_chunk", "content": chunk})
            if delay:
                time.sleep(delay)
    send({"id": rid, "result": {"stopReason": stop}})


def handle_request(rid: Any, method: str, params: dict[str, Any]) -> None:
    if method == "initialize":
        result = {"protocolVersion": 1, "agentCapabilities": {}, "authMethods": [], "agentInfo": {"name": "flood"}}
        send({"id": rid, "result": result})
    elif method == "session/new":
        send({"id": rid, "result": {"sessionId": f"flood-{uuid.uuid4().hex[:12]}"}})
    elif method == "session/prompt":
        threading.Thread(target=run_prompt, args=(rid, params), daemon=True).start()
    else:
        send({"id": rid, "error": {"code": -32601, "message": f"method not found: {method}"}})


def main() -> None:
    for line in sys.stdin:
        if not line.strip():
            continue
        msg = json.loads(line)
        if "method" in msg and "id" in msg:
            handle_request(msg["id"], msg["method"], msg.get("params") or {})
        elif msg.get("method") == "session/cancel":
            sid = (msg.get("params") or {}).get("sessionId", "")
            _cancelled.setdefault(sid, threading.Event()).set()
    sys.exit(0)


if __name__ == "__main__":
    main()
