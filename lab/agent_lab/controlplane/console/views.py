"""What the console shows of an instance: one summary dict built from the link and the store."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent_lab.controlplane.console.queries import ConsoleQueries
    from agent_lab.controlplane.server import ControlPlane


class InstanceViews:
    def __init__(self, cp: ControlPlane, queries: ConsoleQueries) -> None:
        self.cp = cp
        self.queries = queries
        # The hello of an instance's last link: the runtime and session kind stay known while it is away.
        self._hellos: dict[str, dict[str, Any]] = {}

    def summary(self, instance_id: str, highest_epoch: int | None = None, terminated: bool = False) -> dict[str, Any]:
        hello = self.cp.hello(instance_id)
        if hello is not None:
            self._hellos[instance_id] = hello
        hello = self._hellos.get(instance_id)
        beat = self.cp.last_heartbeat(instance_id) or {}
        started = self.queries.latest_payload(instance_id, "driver.started") or {}
        connected = self.cp.connected(instance_id)
        return {
            "instance_id": instance_id,
            "connected": connected,
            "link": "connected" if connected else ("terminated" if terminated else "disconnected"),
            "epoch": highest_epoch if highest_epoch is not None else self.cp.store.highest_epoch(instance_id),
            "runtime": (hello or {}).get("runtime") or started.get("runtime"),
            "session_kind": (hello or {}).get("session_kind"),
            "state": beat.get("state"),
            "run_id": beat.get("run_id"),
            "queued": beat.get("queued") or [],  # queued run ids, in start order (PROTOCOL §3.1)
            "last_heartbeat": beat.get("at"),
            "activity": beat.get("activity"),
            "outbox": beat.get("outbox") or (hello or {}).get("outbox"),
            # The supervisor reports each provider replacement with this diagnostic.
            "provider_restarts": self.queries.count_diagnostics(instance_id, "provider.restarted"),
        }

    def all(self) -> list[dict[str, Any]]:
        known = {row["instance_id"]: row for row in self.queries.instances()}
        for instance_id in self.cp.connected_instances():
            known.setdefault(instance_id, {"instance_id": instance_id, "highest_epoch": None, "terminated_at": None})
        return [self.summary(i, row["highest_epoch"], row["terminated_at"] is not None) for i, row in known.items()]
