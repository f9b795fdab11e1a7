"""The chat's side of the link: what the control plane stores and reports (events, heartbeats, the
link's state, command updates, commands queued elsewhere) shown on the screen and turned into the
actions the chat's loop reacts to."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from agent_lab.dev.common import RUN_TERMINALS, Action
from agent_lab.dev.follow import Following
from agent_lab.dev.view import Status, Transcript

if TYPE_CHECKING:
    from agent_lab.controlplane.live import Subscription


class Pump:
    """`commands`: command id -> kind, of the commands the chat sent; `stopping`: whether the chat is
    stopping (link changes are not news then)."""

    def __init__(
        self,
        *,
        follow: Following,
        status: Status,
        transcript: Transcript,
        commands: Mapping[str, str],
        write: Callable[[str], None],
        push: Callable[[Action], None],
        stopping: Callable[[], bool],
    ) -> None:
        self.follow = follow
        self.status = status
        self.transcript = transcript
        self.commands = commands
        self.write = write
        self.push = push
        self.stopping = stopping
        self.link_lost = False

    def say(self, text: str) -> None:
        self.write(self.transcript.line(text))

    async def run(self, sub: Subscription) -> None:
        try:
            async for item in sub:
                kind = item.get("type")
                if kind == "event":
                    self._on_event(item)
                elif kind == "heartbeat":
                    self.status.heartbeat(item, time.monotonic())
                elif kind == "link":
                    self._on_link(item)
                elif kind == "command.update":
                    self._on_update(item)
                elif kind == "command" and item.get("command_id") not in self.commands:
                    self.push(("elsewhere", item.get("command_id")))
        except Exception as exc:  # a bug here must not leave the user typing into a dead chat
            self.say(f"[dev] internal error while showing events: {type(exc).__name__}: {exc}")
            self.push(("stop", "internal error"))

    def _on_event(self, event: Mapping[str, Any]) -> None:
        self.write(self.transcript.event(event))
        kind = event["kind"]
        if kind == "driver.started":
            self.push(("ready", None))
        elif kind in RUN_TERMINALS:
            if self.follow.terminal(event.get("run_id"), kind):
                self.push(("run_ended", kind))
        elif kind == "permission.requested":
            self.push(("permission", event["payload"]))
        elif kind == "permission.resolved":
            self.push(("permission_settled", event["payload"]))

    def _on_link(self, item: Mapping[str, Any]) -> None:
        self.status.connected = item.get("state") == "up"
        if self.stopping():
            return
        if not self.status.connected:
            self.link_lost = True
            self.say(f"[link] down (close code {item.get('close_code')}); the driver reconnects by itself")
        elif self.link_lost:
            self.link_lost = False
            self.say("[link] up again")

    def _on_update(self, item: Mapping[str, Any]) -> None:
        kind = self.commands.get(str(item.get("command_id")))
        if kind is None or item.get("status") != "failed":
            return
        error = item.get("error") or {}
        if kind == "input.start":
            refused = self.follow.refused(item.get("command_id"))
            if refused == "queued":  # refused before it started (driver.queue_full, say)
                self.say(f"[queue refused] {error.get('code')}: {error.get('message')}")
            elif refused == "run":
                self.say(f"[input refused] {error.get('code')}: {error.get('message')}")
                self.push(("run_ended", "refused"))
            return
        self.say(f"[{kind} failed] {error.get('code')}: {error.get('message')}")
