"""The control plane's HTTP routes the kit can use (`--api`), the reference control plane's shape:

    POST {api}/instances/{id}/commands   {"kind": ..., ...fields} -> {"command_id": ..., "seq": ...}
    GET  {api}/instances/{id}/commands   -> {"commands": [{"command_id", "status", ...}]}
    GET  {api}/instances/{id}/events?after_seq=N&limit=L -> {"events": [{"event_id", "seq", "kind", ...}]}

with the link's bearer token. They are not part of PROTOCOL.md: they let the kit make the control plane
send a command and read back what it receipted. Without them those rules are reported SKIP.
"""

from __future__ import annotations

import asyncio
import json
import urllib.parse
import urllib.request
from typing import Any


class ApiError(Exception):
    pass


class Api:
    def __init__(self, base: str, token: str) -> None:
        self.base = base.rstrip("/")
        self.token = token

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        request = urllib.request.Request(
            f"{self.base}/{path}",
            data=None if body is None else json.dumps(body).encode(),
            method=method,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return json.loads(answer.read())
        except (OSError, ValueError) as exc:
            raise ApiError(f"{method} {self.base}/{path}: {exc}") from None

    async def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        return await asyncio.to_thread(self._call, method, path, body)

    async def post_command(self, instance: str, body: dict[str, Any]) -> dict[str, Any]:
        answer = await self.call("POST", f"instances/{urllib.parse.quote(instance, safe='')}/commands", body)
        if not isinstance(answer, dict) or not isinstance(answer.get("command_id"), str):
            raise ApiError(f"POST commands answered {answer!r:.200}, not {{command_id, seq}}")
        return answer

    async def commands(self, instance: str) -> dict[str, dict[str, Any]]:
        answer = await self.call("GET", f"instances/{urllib.parse.quote(instance, safe='')}/commands")
        rows = answer.get("commands") if isinstance(answer, dict) else None
        if not isinstance(rows, list):
            raise ApiError(f"GET commands answered {answer!r:.200}, not {{commands: [...]}}")
        return {str(c.get("command_id")): c for c in rows if isinstance(c, dict)}

    async def events(self, instance: str, after_seq: int) -> list[dict[str, Any]]:
        query = urllib.parse.urlencode({"after_seq": after_seq, "limit": 10_000})
        answer = await self.call("GET", f"instances/{urllib.parse.quote(instance, safe='')}/events?{query}")
        rows = answer.get("events") if isinstance(answer, dict) else None
        if not isinstance(rows, list):
            raise ApiError(f"GET events answered {answer!r:.200}, not {{events: [...]}}")
        return [e for e in rows if isinstance(e, dict)]
