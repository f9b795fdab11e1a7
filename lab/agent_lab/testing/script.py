"""The marker language every fake model endpoint follows (no I/O).

A fake reads the latest user prompt and plays the script its markers name: `[[say:TEXT]]`,
`[[slow]]`, `[[error]]`, `[[think]]`, and tool calls (`[[shell:CMD]]`, `[[write:PATH:CONTENT]]`, and
per-fake verbs such as `tool` or `mcp`). Each fake turns a `Script` into its own wire format.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass

DEFAULT_TEXT = "Hello from the fake model."
ERROR_MESSAGE = "fake model error: scripted failure"
SLOW_CHUNKS = 400  # x 50 ms = 20 s: long enough that only a working cancel ends it early
SLOW_INTERVAL_S = 0.05
SLOW_TEXT = " ".join(f"word{i}" for i in range(SLOW_CHUNKS))
_SLOW_FOR = re.compile(r"\[\[slow:(\d{1,4})\]\]")  # [[slow:N]]: N chunks (N x 50 ms), for steering tests


def slow_text(chunks: int = SLOW_CHUNKS) -> str:
    return SLOW_TEXT if chunks == SLOW_CHUNKS else " ".join(f"word{i}" for i in range(chunks))


THINKING_TEXT = "Let me think about this carefully."

_MARKER = re.compile(r"\[\[(\w+):(.*?)\]\]", re.DOTALL)


@dataclass(frozen=True, slots=True)
class Script:
    think: bool
    error: bool
    slow: bool
    verb: str | None  # the action marker (say, shell, write, ...), None for the default reply
    arg: str
    slow_chunks: int = SLOW_CHUNKS


def read_script(text: str, verbs: Collection[str]) -> Script:
    """The script of a prompt. Of several action markers the last wins: a provider that merges a
    queued prompt (one interrupted before it ran) into the next user message puts the newest
    instruction last, and a model answers that."""
    actions = [m for m in _MARKER.finditer(text) if m.group(1) in verbs]
    last = actions[-1] if actions else None
    slow_for = _SLOW_FOR.search(text)
    return Script(
        think="[[think]]" in text,
        error="[[error]]" in text,
        slow="[[slow]]" in text or slow_for is not None,
        verb=last.group(1) if last else None,
        arg=last.group(2) if last else "",
        slow_chunks=max(1, int(slow_for.group(1))) if slow_for else SLOW_CHUNKS,
    )
