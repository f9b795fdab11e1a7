"""An ACP session's own state as events (no I/O): its mode, its configuration options and the slash
commands it offers. Each reaches the control plane as a snapshot event of its own (PROTOCOL §4.2 as
implemented, docs/protocol.md): `session.mode.updated`, `session.config.updated`,
`session.commands.updated`. They are session-scoped, not run-scoped: agents send them between turns
too (right after `session/new`, or when the user's mode changes).

Sources: the `modes` and `configOptions` of the `session/new` / `session/load` answer, the answer of
`session/set_config_option`, our own successful `session/set_mode`, and the `session/update`
variants `current_mode_update`, `config_option_update` and `available_commands_update`. A snapshot
equal to the last one sent is not sent again.
"""

from __future__ import annotations

import copy
from typing import Any

Emit = tuple[str, dict[str, Any]]

STATE_UPDATES: frozenset[str] = frozenset({"current_mode_update", "config_option_update", "available_commands_update"})


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _choices(options: Any) -> list[Any]:
    """The values of a select option (a flat list of `{value, name}`, or groups holding such lists)."""
    out: list[Any] = []
    for entry in options if isinstance(options, list) else []:
        if not isinstance(entry, dict):
            continue
        if isinstance(entry.get("options"), list):
            out.extend(_choices(entry["options"]))
        elif "value" in entry:
            out.append(entry["value"])
    return out


def config_option(raw: dict[str, Any]) -> dict[str, Any]:
    kind = _str(raw.get("type")) or "select"
    option: dict[str, Any] = {
        "id": _str(raw.get("id")),
        "name": _str(raw.get("name")),
        "category": raw.get("category") if isinstance(raw.get("category"), str) else None,
        "type": kind,
        "current_value": raw.get("currentValue"),
    }
    if kind == "select":
        option["choices"] = _choices(raw.get("options"))
    return option


class SessionState:
    def __init__(self) -> None:
        self._modes: list[dict[str, str]] = []
        self._mode: str | None = None
        self._sent: dict[str, dict[str, Any]] = {}

    def export(self) -> dict[str, Any]:
        """What a reattached successor restores (driver/adapters/acp/reattach.py): JSON values only, and
        a copy (it is kept while this state changes on)."""
        return copy.deepcopy({"modes": self._modes, "mode": self._mode, "sent": self._sent})

    @classmethod
    def restore(cls, saved: Any) -> SessionState:
        state = cls()
        if isinstance(saved, dict):
            modes, mode, sent = saved.get("modes"), saved.get("mode"), saved.get("sent")
            state._modes = [m for m in modes if isinstance(m, dict)] if isinstance(modes, list) else []
            state._mode = mode if isinstance(mode, str) else None
            if isinstance(sent, dict):
                state._sent = {k: v for k, v in sent.items() if isinstance(k, str) and isinstance(v, dict)}
        return state

    def _snapshot(self, kind: str, payload: dict[str, Any]) -> list[Emit]:
        if self._sent.get(kind) == payload:
            return []
        self._sent[kind] = payload
        return [(kind, payload)]

    def _mode_event(self) -> list[Emit]:
        if self._mode is None:
            return []
        return self._snapshot("session.mode.updated", {"current_mode_id": self._mode, "available_modes": self._modes})

    def opened(self, result: Any) -> list[Emit]:
        """The answer of session/new or session/load."""
        if not isinstance(result, dict):
            return []
        out: list[Emit] = []
        modes = result.get("modes")
        if isinstance(modes, dict):
            self._modes = [
                {"id": _str(m.get("id")), "name": _str(m.get("name")), "description": _str(m.get("description"))}
                for m in modes.get("availableModes") or []
                if isinstance(m, dict)
            ]
            self._mode = _str(modes.get("currentModeId")) or None
            out += self._mode_event()
        out += self.config(result)
        return out

    def mode_set(self, mode_id: str) -> list[Emit]:
        """Our own session/set_mode succeeded (agents need not echo it as an update)."""
        self._mode = mode_id
        return self._mode_event()

    def config(self, result: Any) -> list[Emit]:
        """Anything carrying `configOptions` (a session answer, a set_config_option answer, an update)."""
        options = result.get("configOptions") if isinstance(result, dict) else None
        if not isinstance(options, list):
            return []
        payload = {"options": [config_option(o) for o in options if isinstance(o, dict)]}
        return self._snapshot("session.config.updated", payload)

    def feed(self, update: dict[str, Any]) -> list[Emit]:
        """A `session/update` whose variant is in STATE_UPDATES."""
        variant = update.get("sessionUpdate")
        if variant == "current_mode_update":
            mode = _str(update.get("currentModeId"))
            return self.mode_set(mode) if mode else []
        if variant == "config_option_update":
            return self.config(update)
        if variant == "available_commands_update":
            commands = []
            for command in update.get("availableCommands") or []:
                if not isinstance(command, dict):
                    continue
                hint = command.get("input")
                commands.append(
                    {
                        "name": _str(command.get("name")),
                        "description": _str(command.get("description")),
                        "input_hint": _str(hint.get("hint")) if isinstance(hint, dict) else None,
                    }
                )
            return self._snapshot("session.commands.updated", {"commands": commands})
        return []


def set_config_params(session_id: str, config_id: str, value: Any) -> dict[str, Any]:
    """`session/set_config_option` parameters: a boolean option takes `{type: boolean, value}`, a
    select option a value id (ACP v1 schema)."""
    params: dict[str, Any] = {"sessionId": session_id, "configId": config_id, "value": value}
    if isinstance(value, bool):
        params["type"] = "boolean"
    return params
