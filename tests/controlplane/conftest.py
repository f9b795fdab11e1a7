from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from agent_lab.controlplane import ControlPlane

from tests.controlplane.client import INSTANCE, OPERATOR_TOKEN, OTHER_TOKEN, TOKEN


@pytest.fixture
async def cp(tmp_path: Path) -> AsyncIterator[ControlPlane]:
    async with ControlPlane(
        tmp_path / "cp.db",
        tokens={TOKEN: {INSTANCE, "drv-second"}, OTHER_TOKEN: None},
        heartbeat_interval_ms=5000,
        close_timeout_s=1.0,
        operator_token=OPERATOR_TOKEN,
    ) as plane:
        yield plane
