"""The fake Responses API's script: from a request body to the reply it plans (no I/O).

The script is read from markers in the latest user text of the request's `input` (`plan_reply`); tool
calls name the tool the request itself offers, and whether a tool output already follows the prompt
decides between "call the tool" and "report it done", so the answer depends only on the request.
The SSE events that carry a planned reply are built in `fake_responses`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from agent_lab.testing.script import DEFAULT_TEXT, THINKING_TEXT, read_script, slow_text

_VERBS = ("say", "shell", "write", "mcp")
# Item types that carry a tool's result back to the model.
_TOOL_OUTPUTS = frozenset(
    {
        "function_call_output",
        "custom_tool_call_output",
        "local_shell_call_output",
        "shell_call_output",
        "tool_search_output",
    }
)


# --------------------------------------------------------------------------------------------------
# The script: request body -> planned reply (no I/O)


@dataclass(frozen=True, slots=True)
class Step:
    """One output item of the planned reply."""

    type: str  # "reasoning" | "message" | "tool"
    text: str = ""
    tool: str = ""  # for "tool": "shell" or "write"
    arg: str = ""


@dataclass(frozen=True, slots=True)
class Reply:
    steps: tuple[Step, ...] = ()
    error: bool = False
    slow: bool = False


def _item_texts(item: dict[str, Any]) -> list[str]:
    content = item.get("content")
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [str(c.get("text", "")) for c in content if isinstance(c, dict) and "text" in c]
    return []


def prompt_and_after(body: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """The text of the latest user message carrying a marker (else the latest user text that is not
    Codex's own injected context), and the items that came after it (tool calls and their outputs)."""
    items = body.get("input")
    if isinstance(items, str):
        return items, []
    items = [i for i in items or [] if isinstance(i, dict)]
    fallback: tuple[str, list[dict[str, Any]]] | None = None
    for index in range(len(items) - 1, -1, -1):
        item = items[index]
        if item.get("role") != "user":
            continue
        text = "\n".join(_item_texts(item))
        after = items[index + 1 :]
        if "[[" in text:
            return text, after
        if fallback is None and not text.lstrip().startswith("<"):
            fallback = (text, after)
            # A plain prompt after the tool output starts a new exchange.
            if not any(i.get("type") in _TOOL_OUTPUTS for i in after):
                return fallback
    return fallback or ("", [])


def latest_user_turn(body: dict[str, Any]) -> tuple[str, bool]:
    """The prompt text, and whether a tool output arrived after it."""
    text, after = prompt_and_after(body)
    return text, any(i.get("type") in _TOOL_OUTPUTS for i in after)


def plan_reply(body: dict[str, Any]) -> Reply:
    text, after = prompt_and_after(body)
    answered = any(i.get("type") in _TOOL_OUTPUTS for i in after)
    script = read_script(text, _VERBS)
    lead: tuple[Step, ...] = (Step("reasoning", THINKING_TEXT),) if script.think else ()
    if script.error:
        return Reply(error=True)
    if script.slow:
        return Reply((*lead, Step("message", slow_text(script.slow_chunks))), slow=True)
    if script.verb is None:
        return Reply((*lead, Step("message", DEFAULT_TEXT)))
    verb, arg = script.verb, script.arg
    if verb == "say":
        return Reply((*lead, Step("message", arg)))
    if verb == "mcp":
        return Reply((*lead, _mcp_step(arg, after, body.get("tools"))))
    if answered:
        return Reply((*lead, Step("message", f"{verb} done")))
    return Reply((*lead, Step("tool", tool=verb, arg=arg)))


def _mcp_step(arg: str, after: list[dict[str, Any]], offered: Any = None) -> Step:
    """`[[mcp:SERVER:TOOL:JSON_ARGS]]`: call an MCP tool. Codex app-server defers MCP tools behind its
    `tool_search` tool, so the exchange is: search -> call the tool the search exposed -> report.
    codex-acp offers them in the request's tools directly (an `mcp__SERVER` namespace): then the
    tool is called at once."""
    server, _, rest = arg.partition(":")
    tool, _, raw_args = rest.partition(":")
    outputs = [i for i in after if i.get("type") == "function_call_output"]
    if outputs:
        return Step("message", f"mcp done: {_output_text(outputs[-1].get('output'))}")
    searched = [i for i in after if i.get("type") == "tool_search_output"]
    direct = _find_function(offered, f"mcp__{server}", tool) if not searched else None
    if direct is not None:
        name, namespace = direct
        call = {"name": name, "namespace": namespace, "arguments": raw_args or "{}"}
        return Step("tool", tool="function", arg=json.dumps(call))
    if searched:
        found = _find_function(searched[-1].get("tools"), server, tool)
        if found is None:
            return Step("message", f"mcp tool {server}/{tool} not found")
        name, namespace = found
        call = {"name": name, "namespace": namespace, "arguments": raw_args or "{}"}
        return Step("tool", tool="function", arg=json.dumps(call))
    return Step("tool", tool="tool_search", arg=f"{server} {tool}")


def _output_text(output: Any) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return "".join(str(p.get("text", "")) for p in output if isinstance(p, dict))
    return json.dumps(output)


def _find_function(tools: Any, server: str, tool: str) -> tuple[str, str | None] | None:
    """(name, namespace) of the function for `tool` of `server` among searched tools."""
    for entry in tools if isinstance(tools, list) else []:
        if not isinstance(entry, dict):
            continue
        if entry.get("type") == "namespace":
            inner = _find_function(entry.get("tools"), server, tool)
            if inner is not None and server in str(entry.get("name", "")):
                return inner[0], str(entry.get("name"))
        elif entry.get("type") == "function" and str(entry.get("name", "")).endswith(tool):
            return str(entry["name"]), None
    return None


def chunks(text: str, slow: bool) -> list[str]:
    """Split text into streamed deltas: words when slow, about four pieces otherwise."""
    if slow:
        words = text.split(" ")
        return [w + (" " if i < len(words) - 1 else "") for i, w in enumerate(words)]
    size = max(1, -(-len(text) // 4))
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def add_file_patch(relpath: str, content: str) -> str:
    """An apply_patch envelope that creates `relpath` with `content`."""
    lines = content.split("\n")
    body = "".join(f"+{line}\n" for line in lines)
    return f"*** Begin Patch\n*** Add File: {relpath}\n{body}*** End Patch\n"


def offered_tools(body: dict[str, Any]) -> dict[str, str]:
    """Tool name -> tool type ("function", "custom", "local_shell", ...) as listed in the request."""
    tools: dict[str, str] = {}
    for tool in body.get("tools") or []:
        if isinstance(tool, dict):
            kind = str(tool.get("type", ""))
            tools[str(tool.get("name") or kind)] = kind
    return tools


def estimate_tokens(value: Any) -> int:
    return max(1, len(json.dumps(value)) // 4)
