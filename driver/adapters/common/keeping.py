"""How an adapter gets its provider process: spawned directly, spawned under a keeper, or reattached
to the keeper a dead driver process left (PROTOCOL §8.2; driver/keeper/kept.py, driver/keeper/reattach.py)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import anyio.to_thread

from driver import logs
from driver.adapters.common import host_server
from driver.adapters.common.base import AdapterConfig
from driver.adapters.common.process import ProviderProcess, secret_values
from driver.keeper import kept, reattach
from driver.keeper.kept import KeeperError, KeptProcess
from driver.ports.mcp_host import McpHostServer

log = logs.get(__name__)

AnyProcess = ProviderProcess | KeptProcess


async def provider_process(
    argv: list[str],
    *,
    env: Mapping[str, str],
    cwd: Path,
    name: str,
    config: AdapterConfig,
    runtime: str,
    host: McpHostServer | None = None,
) -> tuple[AnyProcess, reattach.Plan | None]:
    """The process, and the reattach plan when it is a predecessor's provider (then it is already
    initialized: no handshake, and the plan names the thread and the run to continue). `host`: the
    host MCP server the provider is given, whose address a kept one keeps (driver/adapters/common/host_server.py)."""
    grace = config.execution.reattach_grace_ms
    root = Path(config.session.state_dir)
    if grace <= 0:
        return await ProviderProcess.spawn(argv, env=env, cwd=cwd, name=name), None
    logs.add(secret_values(env))
    plan = reattach.take(root)
    if plan is not None:
        try:
            proc = await KeptProcess.attach(root, plan.record, offset=plan.offset)
        except KeeperError as exc:
            log.warning("keeper.attach_failed", error=str(exc))
            await anyio.to_thread.run_sync(kept.discard, root)
        else:
            plan.proc = proc
            plan.attached = True
            proc.turn = plan.turn  # later marks keep the predecessor's offsets (KeptProcess.update_turn)
            log.info("keeper.attached", provider_pid=proc.pid, run_id=plan.run_id, offset=plan.offset)
            return proc, plan
    if await anyio.to_thread.run_sync(kept.supported):
        try:
            proc = await KeptProcess.spawn(argv, env=env, cwd=cwd, state_dir=root, runtime=runtime, grace_ms=grace)
        except (OSError, KeeperError) as exc:
            # The keeper is what failed, not the provider: the run goes on unkept (a driver restart then
            # ends it driver.restarted, as without a grace) rather than every input failing.
            log.warning("keeper.unavailable", error=f"{type(exc).__name__}: {exc}")
            await anyio.to_thread.run_sync(kept.discard, root)
        else:
            host_server.remember(root, host)
            return proc, None
    return await ProviderProcess.spawn(argv, env=env, cwd=cwd, name=name), None
