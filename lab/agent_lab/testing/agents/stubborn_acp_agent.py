"""A small, dependency-free ACP agent for tests: misbehaves on request.

Usage: `python stubborn_acp_agent.py MODE` with MODE one of
- `normal`: streams a reply and honours `session/cancel`;
- `ignore-cancel`: keeps streaming and ignores `session/cancel` (the kernel must escalate to signals);
- `ignore-term`: like `ignore-cancel`, and ignores SIGTERM too (the kernel must escalate to SIGKILL);
- `exit-mid-turn`: exits with status 3 after the first chunks of a reply;
- `no-init`: never answers `initialize`.
- `crash-after-init`: opens sessions normally, then exits with status 4 about 0.3 s later (a provider
  that dies while idle; its last stderr line includes FAKE_PROVIDER_KEY). With `STUBBORN_CRASHES=PATH`
  it crashes only while the file at PATH holds a number above 0, and decrements it each time (so a
  test decides how many starts crash).
- `crash-on-start`: exits with status 4 before reading anything (a provider that cannot start), with
  the same `STUBBORN_CRASHES` budget.

The prompt text is scripted with the same markers as the fake model endpoints, where they make sense
for an agent that has no model:
- no marker: reply "Hello from the stubborn agent." in chunks;
- `[[say:TEXT]]`: reply TEXT;
- `[[term:CMD]]`: run CMD in a terminal that a tool call embeds while it runs (live output);
- `[[echo]]`: reply with the text blocks of the prompt, one per line, then `[type] uri` of the others;
- `[[slow]]`: many small chunks, 50 ms apart, for about 20 s (a cancel target);
  `[[slow:N]]`: N such chunks (`word0` to `wordN-1`, as the fake model endpoints stream them);
- `[[hang]]`: say nothing and never answer (until cancelled, in the modes that honour a cancel);
- `[[think]]`: an `agent_thought_chunk` before the reply;
- `[[mode:ID]]`: a `current_mode_update` to mode ID at the turn's start (combines with the others);
- `[[perm]]`: announce a tool call, ask `session/request_permission`, reply with the chosen option kind;
- `[[perm-unannounced]]`: the same without announcing the tool call first;
- `[[perms:N]]`: ask N permissions at once (N threads, each its own announced tool call), then reply
  "permissions: KIND=COUNT ..." with the chosen option kinds (and `cancelled`) counted, sorted by kind;
- `[[write:PATH:CONTENT]]`: call `fs/write_text_file`; reply "write ok" or "write error: MESSAGE";
- `[[read:PATH]]`: call `fs/read_text_file`; reply "read: CONTENT" or "read error: CODE MESSAGE";
- `[[shell:CMD]]`: run CMD through the client's `terminal/*` methods; reply "exit N: OUTPUT".
- `[[own-shell:CMD]]`: run CMD as the agent's own child (a tool inside the provider's tree, as Codex's
  shell is; `kill -9 $PPID` there kills the agent itself); reply "exit N: OUTPUT".
- `[[bigtool:N]]` / `[[bignested:N]]`: a completed tool call with N bytes of output, as one text or as
  nested objects and arrays (rawOutput); reply "big N".
- `[[stop:REASON]]`: end the turn with that stopReason (after the reply);
- `[[error]]`: answer the prompt with a JSON-RPC error (after the reply);
- `[[garbage]]`: before its reply, write malformed JSON, invalid UTF-8, a line nested 2000 deep,
  responses to ids never sent (of every JSON type) and, one at a time, requests of an unknown method;
  reply "unknown: CODE" with the error code the client answered;
- `[[huge-line]]`: write one 100 MiB line (the client must give up on it, not buffer it);
- `[[session]]`: reply with the JSON params of the `session/new` (or `session/load`) that opened it.
- `[[compute:SECONDS]]`: announce a tool call, then compute (one core, busy) for SECONDS without a
  word on the wire, then complete the call and reply "computed" (a silent tool that works);
- `[[grow:MB]]`: allocate MB megabytes (written, so resident) and keep them for the process's life;
- `[[env:NAME]]`: reply with the value of the environment variable NAME (or "unset");
- `[[meta]]`: reply with the JSON of the prompt request's `_meta` (trace context rides there).
Sessions it created can be loaded again with `session/load` (it advertises `loadSession`, unless
`STUBBORN_LOAD_SESSION=0`: then it is an agent that cannot resume at all).

With `STUBBORN_COMMANDS=1` the `session/new` answer and a slash-commands update come in one write.
With `STUBBORN_NEW_SESSION_DELAY_MS=N` every `session/new` after the first waits N ms (a slow reset).

With `STUBBORN_RICH=1` it is a richer agent: it takes images and embedded context in prompts, and its
sessions have modes (`ask`, `yolo`) and config options of both value types (a select `effort`, a
boolean `fast`), which `session/set_mode` and `session/set_config_option` change.

With `STUBBORN_AUTH_VAR=NAME` in its environment it advertises an `env_var` auth method reading NAME
and answers `session/new` with "auth required" (-32000) until `authenticate` picked that method.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

MODE = sys.argv[1] if len(sys.argv) > 1 else "normal"
MODES = ("normal", "ignore-cancel", "ignore-term", "exit-mid-turn", "no-init", "crash-after-init", "crash-on-start")
IGNORES_CANCEL = MODE in ("ignore-cancel", "ignore-term")
LOAD_SESSION = os.environ.get("STUBBORN_LOAD_SESSION", "1") != "0"
NEW_SESSION_DELAY_S = int(os.environ.get("STUBBORN_NEW_SESSION_DELAY_MS", "0")) / 1000

_out_lock = threading.Lock()
_pending: dict[int, dict[str, Any]] = {}
_pending_cv = threading.Condition()
_next_id = 0
_sessions: set[str] = set()
_cancelled: dict[str, threading.Event] = {}
_session_params: dict[str, Any] = {}
AUTH_VAR = os.environ.get("STUBBORN_AUTH_VAR")
RICH = os.environ.get("STUBBORN_RICH") == "1"
# With the session/new answer, in the same write: an available_commands_update for the new session, as
# claude-agent-acp sends its slash commands right after it (a client must not drop it as unknown).
COMMANDS = os.environ.get("STUBBORN_COMMANDS") == "1"
_config: dict[str, Any] = {"effort": "low", "fast": False}


def session_state() -> dict[str, Any]:
    """The `modes` and `configOptions` of a rich agent's session."""
    if not RICH:
        return {}
    effort = [{"value": v, "name": v.title()} for v in ("low", "high")]
    return {
        "modes": {
            "currentModeId": "ask",
            "availableModes": [{"id": "ask", "name": "Ask"}, {"id": "yolo", "name": "Yolo"}],
        },
        "configOptions": [
            {"id": "effort", "name": "Effort", "type": "select", "currentValue": _config["effort"], "options": effort},
            {"id": "fast", "name": "Fast", "type": "boolean", "currentValue": _config["fast"]},
        ],
    }


_authenticated = threading.Event()


def send(*messages: dict[str, Any]) -> None:
    """One message, or several in one write (the client then reads them in one chunk)."""
    lines = "".join(json.dumps({**message, "jsonrpc": "2.0"}) + "\n" for message in messages)
    with _out_lock:
        sys.stdout.write(lines)
        sys.stdout.flush()


def call(method: str, params: dict[str, Any]) -> dict[str, Any]:
    """Send a request to the client and block this worker until its response arrives."""
    global _next_id
    with _pending_cv:
        _next_id += 1
        # String ids on purpose: a client must echo ids verbatim, whatever their type.
        rid = _next_id
    send({"id": f"stub-{rid}", "method": method, "params": params})
    with _pending_cv:
        while rid not in _pending:
            _pending_cv.wait()
        return _pending.pop(rid)


def update(session_id: str, body: dict[str, Any]) -> None:
    send({"method": "session/update", "params": {"sessionId": session_id, "update": body}})


def chunk(session_id: str, text: str, kind: str = "agent_message_chunk") -> None:
    update(session_id, {"sessionUpdate": kind, "content": {"type": "text", "text": text}})


def stream(session_id: str, text: str, pieces: int, delay: float) -> bool:
    """Stream `text` in `pieces` chunks; return False if a honoured cancel stopped it."""
    step = max(1, len(text) // pieces)
    for i in range(0, len(text), step):
        if _cancelled[session_id].is_set() and not IGNORES_CANCEL:
            return False
        chunk(session_id, text[i : i + step])
        if delay:
            time.sleep(delay)
    return True


def texts(params: dict[str, Any]) -> list[str]:
    return [b.get("text", "") for b in params.get("prompt", []) if b.get("type") == "text"]


def permission(session_id: str, announce: bool) -> str:
    tool_call_id = f"call-{uuid.uuid4().hex[:8]}"
    tool = {"toolCallId": tool_call_id, "title": "Write notes.txt", "kind": "edit", "status": "pending"}
    if announce:
        update(session_id, {"sessionUpdate": "tool_call", **tool, "rawInput": {"path": "notes.txt"}})
    options = [
        # Ids deliberately unrelated to kinds and in an unusual order: clients must map by kind.
        {"optionId": "opt-z", "name": "Reject", "kind": "reject_once"},
        {"optionId": "opt-y", "name": "Always", "kind": "allow_always"},
        {"optionId": "opt-x", "name": "Allow", "kind": "allow_once"},
    ]
    reply = call("session/request_permission", {"sessionId": session_id, "toolCall": tool, "options": options})
    outcome = reply.get("result", {}).get("outcome", {})
    if outcome.get("outcome") == "selected":
        kind = next((o["kind"] for o in options if o["optionId"] == outcome.get("optionId")), "unknown")
        status = "completed" if kind.startswith("allow") else "failed"
        update(session_id, {"sessionUpdate": "tool_call_update", "toolCallId": tool_call_id, "status": status})
        return f"permission {kind}"
    update(session_id, {"sessionUpdate": "tool_call_update", "toolCallId": tool_call_id, "status": "failed"})
    return "permission cancelled"


def permissions(session_id: str, n: int) -> str:
    """`[[perms:N]]`: N permission requests open at the same time (a provider flooding the client)."""
    outcomes: list[str] = []
    lock = threading.Lock()

    def ask() -> None:
        outcome = permission(session_id, announce=True).removeprefix("permission ")
        with lock:
            outcomes.append(outcome)

    workers = [threading.Thread(target=ask, daemon=True) for _ in range(n)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    counts = {kind: outcomes.count(kind) for kind in sorted(set(outcomes))}
    return "permissions: " + " ".join(f"{kind}={count}" for kind, count in counts.items())


def big_tool(session_id: str, *, nested: bool, size: int) -> str:
    """A tool call whose output is `size` bytes: one text (`bigtool`), or nested objects and arrays
    in rawOutput (`bignested`: 64 documents of text plus a long array of short lines)."""
    tool_call_id = f"call-{uuid.uuid4().hex[:8]}"
    update(
        session_id,
        {
            "sessionUpdate": "tool_call",
            "toolCallId": tool_call_id,
            "title": "big",
            "kind": "execute",
            "status": "in_progress",
            "rawInput": {"command": "big"},
        },
    )
    done: dict[str, Any] = {"sessionUpdate": "tool_call_update", "toolCallId": tool_call_id, "status": "completed"}
    if nested:
        part = size // 2 // 64
        docs = [{"type": "text", "text": chr(97 + i % 26) * part, "meta": {"n": i}} for i in range(64)]
        lines = [f"line {i:08d}" for i in range(size // 2 // 16)]
        done["rawOutput"] = {"content": docs, "lines": lines, "exit_code": 0}
    else:
        done["content"] = [{"type": "content", "content": {"type": "text", "text": "o" * size}}]
    update(session_id, done)
    return f"big {size}"


_hoard: list[bytes] = []


def compute(session_id: str, seconds: float) -> str:
    tool_call_id = f"call-{uuid.uuid4().hex[:8]}"
    tool = {"toolCallId": tool_call_id, "title": "Compute", "kind": "execute", "status": "in_progress"}
    update(session_id, {"sessionUpdate": "tool_call", **tool})
    deadline = time.monotonic() + seconds
    x = 0
    while time.monotonic() < deadline:
        for i in range(10_000):
            x ^= i * i
    update(session_id, {"sessionUpdate": "tool_call_update", "toolCallId": tool_call_id, "status": "completed"})
    return "computed"


def error_text(reply: dict[str, Any]) -> str:
    err = reply["error"]
    return f"{err.get('code')} {err.get('message')}"


def shell(session_id: str, command: str) -> str:
    created = call("terminal/create", {"sessionId": session_id, "command": "sh", "args": ["-c", command]})
    if "error" in created:
        return "terminal error: " + error_text(created)
    tid = created["result"]["terminalId"]
    waited = call("terminal/wait_for_exit", {"sessionId": session_id, "terminalId": tid})
    output = call("terminal/output", {"sessionId": session_id, "terminalId": tid})
    call("terminal/release", {"sessionId": session_id, "terminalId": tid})
    return f"exit {waited['result'].get('exitCode')}: {output['result']['output']}"


def raw(data: bytes) -> None:
    with _out_lock:
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()


def garbage() -> str:
    raw(b"{not json\n")
    raw(b'{"jsonrpc": "2.0", "method": "session/update", "params": {"x": "\xff\xfe"}}\n')  # invalid UTF-8
    raw(b"[" * 2000 + b"]" * 2000 + b"\n")
    for rid in (999, '"nobody"', '{"a": 1}', "[1]", "1.5", "true", "null"):
        raw(b'{"jsonrpc": "2.0", "id": %s, "result": {}}\n' % str(rid).encode())
    for i in range(30):
        raw(b"garbage line %d\n" % i)
    codes = [str(error_code(call("x/unknown", {"i": i}))) for i in range(3)]
    return "unknown: " + ",".join(codes)


def error_code(response: dict[str, Any]) -> Any:
    return (response.get("error") or {}).get("code")


def huge_line() -> None:
    block = b"x" * (1 << 20)
    try:
        for _ in range(100):
            raw(block)
        raw(b"\n")
    except BrokenPipeError:
        os._exit(5)  # the client hung up on the line, as it should


def term(session_id: str, command: str) -> str:
    """Run `command` in a client terminal that a tool call embeds while it runs (its output is live)."""
    created = call("terminal/create", {"sessionId": session_id, "command": "sh", "args": ["-c", command]})
    if "error" in created:
        return "terminal error: " + error_text(created)
    tid = created["result"]["terminalId"]
    tool = {"toolCallId": f"term-{tid}", "title": command, "kind": "execute", "status": "in_progress"}
    content = [{"type": "terminal", "terminalId": tid}]
    update(session_id, {"sessionUpdate": "tool_call", **tool, "content": content})
    waited = call("terminal/wait_for_exit", {"sessionId": session_id, "terminalId": tid})
    if "error" in waited:  # e.g. the terminal is gone with the driver that ran it (PROTOCOL §8.2)
        failed = {"sessionUpdate": "tool_call_update", "toolCallId": tool["toolCallId"], "status": "failed"}
        update(session_id, failed)
        return "terminal error: " + error_text(waited)
    code = waited["result"].get("exitCode")
    done = {"sessionUpdate": "tool_call_update", "toolCallId": tool["toolCallId"], "status": "completed"}
    update(session_id, {**done, "rawOutput": {"exit_code": code}})
    call("terminal/release", {"sessionId": session_id, "terminalId": tid})
    return f"term exit {code}"


def run_prompt(rid: Any, params: dict[str, Any]) -> None:
    session_id = params["sessionId"]
    _cancelled[session_id] = threading.Event()
    # Markers are read from the user's own block, the last one: a replayed transcript (PROTOCOL §8)
    # arrives as an earlier block and may hold the markers of earlier prompts.
    text = (texts(params) or [""])[-1]
    if MODE == "exit-mid-turn":
        chunk(session_id, "About to ")
        chunk(session_id, "vanish")
        sys.stderr.write("stubborn agent: exiting mid-turn on purpose\n")
        sys.stderr.flush()
        os._exit(3)
    if "[[hang]]" in text:
        # A provider that stopped answering: nothing on the wire until a cancel it honours.
        while not (_cancelled[session_id].wait(0.05) and not IGNORES_CANCEL):
            pass
        send({"id": rid, "result": {"stopReason": "cancelled"}})
        return
    if m := re.search(r"\[\[mode:([\w-]+)\]\]", text):
        # The session's mode changes mid-turn, as the agent's own doing (a session state update).
        update(session_id, {"sessionUpdate": "current_mode_update", "currentModeId": m.group(1)})
    if "[[think]]" in text:
        chunk(session_id, "Thinking about it.", "agent_thought_chunk")
    reply = "Hello from the stubborn agent."
    if m := re.search(r"\[\[compute:([0-9.]+)\]\]", text):
        reply = compute(session_id, float(m.group(1)))
    elif m := re.search(r"\[\[grow:([0-9]+)\]\]", text):
        _hoard.append(b"\x01" * (int(m.group(1)) * 1024 * 1024))
        reply = f"holding {sum(len(b) for b in _hoard) // (1024 * 1024)} MB"
    elif m := re.search(r"\[\[env:(\w+)\]\]", text):
        reply = os.environ.get(m.group(1), "unset")
    elif "[[meta]]" in text:
        reply = json.dumps(params.get("_meta"), sort_keys=True)
    elif "[[session]]" in text:
        reply = json.dumps(_session_params.get(session_id), sort_keys=True)
    elif "[[echo]]" in text:
        links = [f"[{b['type']}] {b.get('uri')}" for b in params.get("prompt", []) if b.get("type") != "text"]
        reply = "\n".join(texts(params) + links)
    elif m := re.search(r"\[\[say:(.*?)\]\]", text, re.S):
        reply = m.group(1)
    elif "[[perm-unannounced]]" in text:
        reply = permission(session_id, announce=False)
    elif "[[perm]]" in text:
        reply = permission(session_id, announce=True)
    elif m := re.search(r"\[\[perms:(\d{1,4})\]\]", text):
        reply = permissions(session_id, int(m.group(1)))
    elif m := re.search(r"\[\[write:(.*?):(.*?)\]\]", text, re.S):
        r = call("fs/write_text_file", {"sessionId": session_id, "path": m.group(1), "content": m.group(2)})
        reply = "write ok" if "result" in r else "write error: " + error_text(r)
    elif m := re.search(r"\[\[read:(.*?)\]\]", text, re.S):
        r = call("fs/read_text_file", {"sessionId": session_id, "path": m.group(1)})
        reply = "read: " + r["result"]["content"] if "result" in r else "read error: " + error_text(r)
    elif m := re.search(r"\[\[shell:(.*?)\]\]", text, re.S):
        reply = shell(session_id, m.group(1))
    elif m := re.search(r"\[\[own-shell:(.*?)\]\]", text, re.S):
        done = subprocess.run(["sh", "-c", m.group(1)], capture_output=True, text=True, check=False)
        reply = f"exit {done.returncode}: {done.stdout}{done.stderr}"
    elif m := re.search(r"\[\[big(tool|nested):(\d+)\]\]", text):
        reply = big_tool(session_id, nested=m.group(1) == "nested", size=int(m.group(2)))
    elif "[[garbage]]" in text:
        reply = garbage()
    elif "[[huge-line]]" in text:
        huge_line()
    elif m := re.search(r"\[\[term:(.*?)\]\]", text, re.S):
        reply = term(session_id, m.group(1))
    if slow := re.search(r"\[\[slow(?::(\d{1,4}))?\]\]", text):
        chunks = max(1, int(slow.group(1))) if slow.group(1) else 400
        long = "".join(f"word{i} " for i in range(chunks))
        finished = stream(session_id, long, chunks, 0.05)
    else:
        finished = stream(session_id, reply, 3, 0.0)
    cancelled = not finished or (_cancelled[session_id].is_set() and not IGNORES_CANCEL)
    if "[[error]]" in text:
        send({"id": rid, "error": {"code": -32603, "message": "stubborn agent: scripted failure"}})
        return
    stop = m.group(1) if (m := re.search(r"\[\[stop:(\w+)\]\]", text)) else "end_turn"
    send({"id": rid, "result": {"stopReason": "cancelled" if cancelled else stop}})


def auth_methods() -> list[dict[str, Any]]:
    if not AUTH_VAR:
        return []
    return [
        {"id": "stub-login", "name": "Log in"},
        {"id": "stub-env", "type": "env_var", "name": f"Use {AUTH_VAR}", "vars": [{"name": AUTH_VAR}]},
    ]


def handle_request(rid: Any, method: str, params: dict[str, Any]) -> None:
    if method == "initialize":
        if MODE == "no-init":
            return
        send(
            {
                "id": rid,
                "result": {
                    "protocolVersion": 1,
                    "agentCapabilities": {
                        "loadSession": LOAD_SESSION,
                        "sessionCapabilities": {"additionalDirectories": {}},
                        "mcpCapabilities": {"http": True},
                        "promptCapabilities": {"image": RICH, "embeddedContext": RICH},
                    },
                    "authMethods": auth_methods(),
                    "agentInfo": {"name": "stubborn", "version": "0"},
                },
            }
        )
    elif method == "authenticate":
        if AUTH_VAR and params.get("methodId") == "stub-env" and os.environ.get(AUTH_VAR):
            _authenticated.set()
            send({"id": rid, "result": {}})
        else:
            send({"id": rid, "error": {"code": -32602, "message": "unknown auth method"}})
    elif method == "session/new":
        if AUTH_VAR and not _authenticated.is_set():
            send({"id": rid, "error": {"code": -32000, "message": "Authentication required"}})
            return
        if _sessions and NEW_SESSION_DELAY_S:
            time.sleep(NEW_SESSION_DELAY_S)  # a slow session.reset (the first session opens at once)
        sid = f"stub-{uuid.uuid4().hex[:12]}"
        _sessions.add(sid)
        _session_params[sid] = params
        answer = {"id": rid, "result": {"sessionId": sid, **session_state()}}
        if COMMANDS:
            commands = [{"name": "review", "description": "Review the changes", "input": {"hint": "a path"}}]
            update = {"sessionUpdate": "available_commands_update", "availableCommands": commands}
            send(answer, {"method": "session/update", "params": {"sessionId": sid, "update": update}})
        else:
            send(answer)
    elif method == "session/load":
        sid = params.get("sessionId", "")
        if sid.startswith("stub-"):
            _sessions.add(sid)
            _session_params[sid] = params
            send({"id": rid, "result": session_state()})
        else:
            send({"id": rid, "error": {"code": -32002, "message": f"session not found: {sid}"}})
    elif method == "session/set_mode" and RICH:
        send({"id": rid, "result": {}})
    elif method == "session/set_config_option" and RICH:
        _config[params["configId"]] = params["value"]
        send({"id": rid, "result": {"configOptions": session_state()["configOptions"]}})
    elif method == "session/prompt":
        threading.Thread(target=run_prompt, args=(rid, params), daemon=True).start()
    else:
        send({"id": rid, "error": {"code": -32601, "message": f"method not found: {method}"}})


_crash: list[bool] = []  # set once a crash was considered: one per process


def crash_soon() -> None:
    """`crash-after-init`: die shortly after a session opened, if the crash budget allows."""
    if not crash_budget_left():
        return

    def die() -> None:
        time.sleep(0.3)
        # Says its credential out loud, as crashing programs do: the driver must redact it.
        leak = os.environ.get("FAKE_PROVIDER_KEY", "")
        sys.stderr.write(f"stubborn agent: crashing after init on purpose (FAKE_PROVIDER_KEY={leak})\n")
        sys.stderr.flush()
        os._exit(4)

    threading.Thread(target=die, daemon=True).start()


def crash_budget_left() -> bool:
    """Whether a `crash-*` mode should crash now; spends one unit of the STUBBORN_CRASHES budget."""
    budget = os.environ.get("STUBBORN_CRASHES")
    if not budget:
        return True
    try:
        with open(budget) as f:
            left = int(f.read().strip() or 0)
    except (OSError, ValueError):
        left = 0
    if left <= 0:
        return False
    with open(budget, "w") as f:
        f.write(str(left - 1))
    return True


def main() -> None:
    if MODE not in MODES:
        sys.stderr.write(f"unknown mode {MODE!r}; use one of {', '.join(MODES)}\n")
        sys.exit(2)
    if MODE == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if MODE == "crash-on-start" and crash_budget_left():
        sys.stderr.write("stubborn agent: crashing at start on purpose\n")
        sys.stderr.flush()
        os._exit(4)
    for line in sys.stdin:
        if not line.strip():
            continue
        msg = json.loads(line)
        if "method" in msg and "id" in msg:
            handle_request(msg["id"], msg["method"], msg.get("params") or {})
            if MODE == "crash-after-init" and msg["method"] in ("session/new", "session/load") and not _crash:
                _crash.append(True)
                crash_soon()
        elif "method" in msg:
            if msg["method"] == "session/cancel":
                sid = (msg.get("params") or {}).get("sessionId", "")
                _cancelled.setdefault(sid, threading.Event()).set()
        else:
            rid = int(str(msg.get("id", "")).removeprefix("stub-") or -1)
            with _pending_cv:
                _pending[rid] = msg
                _pending_cv.notify_all()
    # Stdin closed: a well-behaved agent exits (unlike codex-acp, which needs SIGTERM).
    sys.exit(0)


if __name__ == "__main__":
    main()
