"""How an adapter gets its provider process (driver/adapters/common/keeping.py): under a keeper with a grace,
and unkept, still working, when the keeper itself cannot be set up."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from driver.adapters.common import keeping
from driver.adapters.common.base import AdapterConfig
from driver.adapters.common.process import ProviderProcess
from driver.keeper import kept, reattach
from driver.keeper.kept import KeptProcess
from driver.protocol.boot import ExecutionConfig, SessionConfig

ECHO = ["/bin/sh", "-c", 'while read -r l; do echo "got:$l"; done']

pytestmark = pytest.mark.skipif(not kept.supported(), reason="needs the PID namespace (bwrap)")


def config(tmp: Path) -> AdapterConfig:
    session = SessionConfig(id="s", agent_id="a", kind="pet", cwd=str(tmp), state_dir=str(tmp))
    execution = ExecutionConfig(revision="r", runtime="acp", reattach_grace_ms=30_000)
    return AdapterConfig(session=session, execution=execution, state_dir=tmp, project_root=tmp)


async def echo_once(proc: keeping.AnyProcess) -> bytes:
    await proc.stdin.send(b"one\n")
    got = b""
    with anyio.fail_after(10):
        while b"\n" not in got:
            got += await proc.stdout.receive()
    return got


async def provider(tmp: Path) -> tuple[keeping.AnyProcess, reattach.Plan | None]:
    return await keeping.provider_process(
        ECHO, env={"PATH": "/usr/bin:/bin"}, cwd=tmp, name="t", config=config(tmp), runtime="acp"
    )


async def test_a_grace_keeps_the_provider(tmp_path: Path) -> None:
    proc, plan = await provider(tmp_path)
    try:
        assert isinstance(proc, KeptProcess) and plan is None
        assert await echo_once(proc) == b"got:one\n"
    finally:
        await proc.terminate()
        kept.discard(tmp_path)


async def test_a_keeper_that_cannot_be_set_up_leaves_the_provider_unkept_and_working(tmp_path: Path) -> None:
    (tmp_path / "driver").mkdir()
    (tmp_path / "driver" / "keeper").write_text("not a folder")  # its files cannot be made
    proc, plan = await provider(tmp_path)
    try:
        assert isinstance(proc, ProviderProcess) and plan is None
        assert await echo_once(proc) == b"got:one\n"
    finally:
        await proc.terminate()
