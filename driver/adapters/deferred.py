"""An adapter whose real class is imported only when the provider starts, in a worker thread.

Importing a provider SDK can take seconds (the Claude SDK pulls in pydantic and the MCP stack). The
kernel builds its adapter before the link dials, so a plain import would delay `hello` by that much and
stall the event loop. This wrapper answers `capabilities` from the registry's static table, and loads
and builds the real adapter at `start()`, off the event loop; every other call is delegated.
"""

from __future__ import annotations

from typing import ClassVar

import anyio

from driver.adapters.common.base import Adapter, AdapterConfig, Ports, TurnOutcome
from driver.adapters.registry import adapter_class
from driver.protocol.capabilities import capabilities_of
from driver.protocol.commands import RunInput


class DeferredAdapter(Adapter):
    runtime: ClassVar[str] = "deferred"
    capabilities: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, config: AdapterConfig, ports: Ports) -> None:
        super().__init__(config, ports)
        self.runtime_name = config.execution.runtime
        self.declared = capabilities_of(self.runtime_name)
        self.inner: Adapter | None = None

    async def _load(self) -> Adapter:
        if self.inner is None:
            cls = await anyio.to_thread.run_sync(adapter_class, self.runtime_name)
            self.inner = cls(self.config, self.ports)
        return self.inner

    async def start(self) -> None:
        await (await self._load()).start()

    async def run(self, run_id: str, run_input: RunInput) -> TurnOutcome:
        return await (await self._load()).run(run_id, run_input)

    async def steer(self, run_id: str, run_input: RunInput) -> None:
        await (await self._load()).steer(run_id, run_input)

    async def resume(self, run_id: str) -> TurnOutcome:
        return await (await self._load()).resume(run_id)

    async def cancel(self) -> None:
        if self.inner is not None:
            await self.inner.cancel()

    async def reset(self) -> tuple[str | None, str | None]:
        return await (await self._load()).reset()

    async def stop(self) -> None:
        if self.inner is not None:
            await self.inner.stop()

    def detach(self) -> bool:
        return self.inner.detach() if self.inner is not None else False

    def process_group_ids(self) -> list[int]:
        return self.inner.process_group_ids() if self.inner is not None else []

    async def wait_exited(self) -> None:
        await (await self._load()).wait_exited()

    def stderr_tail(self) -> str:
        return self.inner.stderr_tail() if self.inner is not None else ""

    @property
    def native_id(self) -> str | None:
        return self.inner.native_id if self.inner is not None else None
