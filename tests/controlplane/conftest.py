from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from agent_lab.controlplane import ControlPlane
from agent_lab.controlplane.pg_cluster import Cluster, new_database

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


# -- PostgreSQL (issue 34): one throwaway cluster per test session, a fresh database per test ---------------


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Cluster]:
    with Cluster() as cluster:
        yield cluster


@pytest.fixture
def pg_url(pg_cluster: Cluster) -> str:
    """A `postgresql://` URL of a database of its own for this test."""
    return new_database(pg_cluster)


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Each engine's store name in turn: a SQLite file, then a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return str(tmp_path / "cp.db")
    return new_database(request.getfixturevalue("pg_cluster"))
