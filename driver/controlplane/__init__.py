"""Reference control plane: a real PROTOCOL.md server with a SQLite store and fault injection."""

from driver.controlplane.faults import Faults
from driver.controlplane.live import Subscription
from driver.controlplane.server import ControlPlane
from driver.controlplane.store import Store

__all__ = ["ControlPlane", "Faults", "Store", "Subscription"]
