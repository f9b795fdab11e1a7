"""Reference control plane: a real PROTOCOL.md server with a SQLite store and fault injection."""

from agent_lab.controlplane.faults import Faults
from agent_lab.controlplane.live import Subscription
from agent_lab.controlplane.server import ControlPlane
from agent_lab.controlplane.store import Store

__all__ = ["ControlPlane", "Faults", "Store", "Subscription"]
