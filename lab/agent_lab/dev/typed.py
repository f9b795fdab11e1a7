"""What a line typed into the chat means (no I/O): a command (`/status`, `/help`, `/shell`, `/link`,
`/quit`, `/queue TEXT`), words for the agent, or the answer to a permission prompt."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

TypedKind = Literal["status", "help", "shell", "link", "quit", "queue", "say", "empty"]

_COMMANDS: dict[str, TypedKind] = {
    "/status": "status",
    "/help": "help",
    "/shell": "shell",
    "/link": "link",
    "/quit": "quit",
    "/exit": "quit",
}
_ANSWERS = {"y": True, "yes": True, "n": False, "no": False}


@dataclass(frozen=True, slots=True)
class Typed:
    kind: TypedKind
    text: str = ""  # `say`: the line as typed (its end of line cut); `queue`: what follows /queue


def parse(raw: str) -> Typed:
    text = raw.rstrip("\r\n")
    command = text.strip()
    if command in _COMMANDS:
        return Typed(_COMMANDS[command])
    if command.startswith("/queue"):
        return Typed("queue", command.removeprefix("/queue").strip())
    return Typed("say", text) if command else Typed("empty")


def answer(raw: str) -> bool | None:
    """A permission prompt's answer: allow, reject, or None (not an answer: ask again)."""
    return _ANSWERS.get(raw.rstrip("\r\n").strip().lower())
