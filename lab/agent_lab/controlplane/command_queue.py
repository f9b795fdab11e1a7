# mypy: disable-error-code="misc"
# (mypy allows a mixin's `self: ControlPlane` only for protocols; the annotation is what types these methods.)
"""The command queue (PROTOCOL §4): commands stored in per-instance order, sent now when the link is
ready and replayed after the next welcome otherwise, each at most once per link."""

from __future__ import annotations

import contextlib
import json
from typing import TYPE_CHECKING, Any

from websockets.exceptions import ConnectionClosed

from agent_lab.controlplane.link import CLOSE_TERMINATED, Link
from driver import logs

log = logs.get("agent_driver.controlplane")

if TYPE_CHECKING:
    pass
if TYPE_CHECKING:
    from agent_lab.controlplane.server import ControlPlane


class CommandQueue:
    """Mixed into `ControlPlane`: queueing, resending and link control from the control plane's side."""

    async def send_command(
        self: ControlPlane, instance_id: str, kind: str, *, command_id: str | None = None, **fields: Any
    ) -> tuple[str, int]:
        """Store a command (next seq of the instance) and send it now if the instance is connected;
        otherwise it goes out after the next welcome."""
        cmd = await self.engine.add_command(instance_id, kind, fields, command_id)
        # Watchers (the console, the dev chat) learn of commands that others queued.
        self._live.publish(instance_id, {"type": "command", "command_id": cmd["command_id"], "kind": kind})
        link = self._links.get(instance_id)
        if link is not None and link.ready:
            await self._send_command(link, cmd)
        log.info("command.queued", instance_id=instance_id, command_id=cmd["command_id"], seq=cmd["seq"], kind=kind)
        return cmd["command_id"], cmd["seq"]

    async def resend_command(self: ControlPlane, command_id: str) -> None:
        """Send a stored command again on the current link (an idempotency probe)."""
        cmd = self.store.command(command_id)
        if cmd is None:
            raise KeyError(command_id)
        link = self._links.get(cmd["instance_id"])
        if link is None or not link.ready:
            raise RuntimeError(f"instance {cmd['instance_id']} is not connected")
        await link.ws.send(json.dumps(cmd["body"]))

    async def send_raw(
        self: ControlPlane, instance_id: str, frame: dict[str, Any] | str | bytes, *, text: bool = True
    ) -> None:
        """Send any frame as is, unstored (for tests of invalid or conflicting commands). Bytes go out
        unvalidated, as a text frame (invalid UTF-8 included) or, with `text=False`, a binary one."""
        link = self._links.get(instance_id)
        if link is None or not link.ready:
            raise RuntimeError(f"instance {instance_id} is not connected")
        data = json.dumps(frame) if isinstance(frame, dict) else frame
        await link.ws.send(data, text=text)

    async def terminate(self: ControlPlane, instance_id: str, reason: str = "terminated") -> None:
        """Mark the instance terminated (durably: later links are refused with 4410) and close its link."""
        await self.engine.terminate(instance_id)
        await self.close_link(instance_id, CLOSE_TERMINATED, reason)

    async def close_link(self: ControlPlane, instance_id: str, code: int, reason: str = "") -> bool:
        """Close the instance's link with `code` (1006 drops the TCP connection without a close frame)."""
        link = self._links.get(instance_id)
        if link is None:
            return False
        await self._close(link.ws, code, reason)
        return True

    async def _send_command(self: ControlPlane, link: Link, cmd: dict[str, Any]) -> None:
        # Replay after welcome and a live send_command may race for the same command: send it once.
        if cmd["command_id"] in link.sent_commands:
            return
        link.sent_commands.add(cmd["command_id"])
        # On a closed link the command is not terminal, so it is resent after the next welcome.
        with contextlib.suppress(ConnectionClosed):
            await link.ws.send(json.dumps(cmd["body"]))
