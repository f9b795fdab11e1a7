"""Fixtures of the telemetry tests: the real-driver ones share the kernel tests' fixtures."""

from tests.kernel.conftest import drivers, fakes

__all__ = ["drivers", "fakes"]
