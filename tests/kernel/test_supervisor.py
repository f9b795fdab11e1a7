"""ProviderSupervisor without processes: an in-memory adapter whose start can fail and whose process
can 'exit' on cue, to pin down the bookkeeping (one replacement per adapter, crashes counted once,
start errors visible to inputs, stop ends everything). The real processes are in test_supervision.py."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest
from agent_lab.testing.ports import recording_ports

from driver import tasks
from driver.adapters.common.base import Adapter, AdapterConfig, ProviderError, TurnOutcome
from driver.kernel.supervision import CrashWindow
from driver.kernel.supervisor import ProviderSupervisor
from driver.protocol.boot import ExecutionConfig, SessionConfig
from driver.protocol.commands import RunInput


class ScriptedAdapter(Adapter):
    runtime: ClassVar[str] = "scripted"
    capabilities: ClassVar[frozenset[str]] = frozenset()
    # Start outcomes consumed in order by every adapter instance: None = success, else the error.
    script: ClassVar[list[ProviderError | None]] = []
    instances: ClassVar[list[ScriptedAdapter]] = []

    def __init__(self, config: AdapterConfig, ports: Any) -> None:
        super().__init__(config, ports)
        self.exited = anyio.Event()
        self.started = False
        self.stopped = False
        ScriptedAdapter.instances.append(self)

    async def start(self) -> None:
        outcome = ScriptedAdapter.script.pop(0) if ScriptedAdapter.script else None
        if outcome is not None:
            raise outcome
        self.started = True

    async def run(self, run_id: str, run_input: RunInput) -> TurnOutcome:
        return TurnOutcome(status="completed")

    async def cancel(self) -> None:
        pass

    async def reset(self) -> tuple[str | None, str | None]:
        return None, None

    async def stop(self) -> None:
        self.stopped = True

    async def wait_exited(self) -> None:
        await self.exited.wait()


class Reports:
    """The events port of the boundary the supervisor's tasks run on (the kernel's, in the driver)."""

    def __init__(self, diagnostics: list[dict[str, Any]]) -> None:
        self.diagnostics = diagnostics

    async def emit(self, kind: str, payload: dict[str, Any]) -> None:
        self.diagnostics.append(payload)


def make(
    tmp: Path, diagnostics: list[dict[str, Any]], *, limit: int = 5, build: Callable[[], Adapter] | None = None
) -> ProviderSupervisor:
    session = SessionConfig(id="s", agent_id="a", kind="cattle", cwd=str(tmp), state_dir=str(tmp))
    config = AdapterConfig(
        session=session, execution=ExecutionConfig(revision="r", runtime="acp"), state_dir=tmp, project_root=tmp
    )
    ports, _, _ = recording_ports(tmp)

    async def emit(kind: str, payload: dict[str, Any]) -> None:
        assert kind == "diagnostic.reported"
        diagnostics.append(payload)

    return ProviderSupervisor(
        build or (lambda: ScriptedAdapter(config, ports)),
        emit,
        start_timeout_s=5,
        stop_timeout_s=1,
        crashes=CrashWindow(limit=limit, backoff_base_s=0.01, backoff_cap_s=0.02),
    )


@asynccontextmanager
async def supervised(
    tmp: Path, diagnostics: list[dict[str, Any]], *, limit: int = 5, build: Callable[[], Adapter] | None = None
) -> AsyncIterator[ProviderSupervisor]:
    ScriptedAdapter.script = []
    ScriptedAdapter.instances = []
    async with tasks.boundary("test", Reports(diagnostics)) as tg:
        sup = make(tmp, diagnostics, limit=limit, build=build)
        sup.bind(tg)
        yield sup
        tg.cancel()


def codes(diagnostics: list[dict[str, Any]]) -> list[str]:
    return [d["code"] for d in diagnostics]


async def wait_codes(diagnostics: list[dict[str, Any]], code: str, count: int = 1) -> None:
    with anyio.fail_after(5):
        while codes(diagnostics).count(code) < count:  # noqa: ASYNC110 (a list filled by a callback)
            await anyio.sleep(0.005)


async def test_exit_while_idle_replaces_once_and_counts_one_crash(tmp_path: Path) -> None:
    diagnostics: list[dict[str, Any]] = []
    async with supervised(tmp_path, diagnostics) as sup:
        await sup.boot()
        first = await sup.ready()
        first.exited.set()  # type: ignore[attr-defined]
        sup.lost(first, "seen by the run path too", crashed=True)  # the watcher's own report is then a no-op
        await wait_codes(diagnostics, "provider.restarted")
        second = await sup.ready()
        assert second is not first and first.stopped  # type: ignore[attr-defined]
        assert sup.crashes.count == 1
        assert len(ScriptedAdapter.instances) == 2
        restarting = [d for d in diagnostics if d["code"] == "provider.restarting"]
        assert len(restarting) == 1 and restarting[0]["details"]["crashed"] is True


async def test_failed_starts_are_retried_visible_to_inputs_and_trip_the_loop(
    tmp_path: Path,
) -> None:
    diagnostics: list[dict[str, Any]] = []
    async with supervised(tmp_path, diagnostics, limit=3) as sup:
        boom = ProviderError("provider.start_failed", "no luck", retryable=True)
        ScriptedAdapter.script = [boom, boom, boom, None]
        await sup.boot()
        with pytest.raises(ProviderError) as first:
            await sup.ready()  # the failed start's own error, not a wait for the retry
        assert first.value.code in ("provider.start_failed", "provider.crash_loop")
        await wait_codes(diagnostics, "provider.crash_loop_cleared")
        assert codes(diagnostics).count("provider.start_failed") == 3
        assert "provider.crash_loop" in codes(diagnostics)
        adapter = await sup.ready()
        assert adapter.started  # type: ignore[attr-defined]
        assert all(a.stopped for a in ScriptedAdapter.instances[:3])  # every failed start was cleaned up


async def test_non_retryable_start_error_is_not_retried(tmp_path: Path) -> None:
    diagnostics: list[dict[str, Any]] = []
    async with supervised(tmp_path, diagnostics) as sup:
        ScriptedAdapter.script = [ProviderError("provider.missing", "no binary")]
        await sup.boot()
        for _ in range(2):
            with pytest.raises(ProviderError, match="no binary"):
                await sup.ready()
        assert len(ScriptedAdapter.instances) == 1 and "provider.restarting" not in codes(diagnostics)


async def test_stop_during_backoff_ends_replacement_and_waiting_inputs(tmp_path: Path) -> None:
    diagnostics: list[dict[str, Any]] = []
    async with supervised(tmp_path, diagnostics) as sup:
        sup.crashes.backoff_base_s = sup.crashes.backoff_cap_s = 30.0
        await sup.boot()
        sup.crashes.record()  # a crash already in the window: the next restart waits 30 s
        sup.lost(await sup.ready(), "crash", crashed=True)
        await wait_codes(diagnostics, "provider.restarting")
        assert diagnostics[-1]["details"]["delay_ms"] == 30_000
        await sup.stop()
        with anyio.fail_after(1), pytest.raises(ProviderError) as stopped:
            await sup.ready()
        assert stopped.value.code == "driver.stopping"
        assert len(ScriptedAdapter.instances) == 1  # no new provider was started


async def test_a_build_that_raises_is_a_failed_start_retried_with_backoff(tmp_path: Path) -> None:
    """Issue 30: building the replacement (preparing the agent's home) raised out of the supervisor
    and the driver exited 70. Now the build's error is the start's: said, visible to an input,
    retried with backoff, and the next build that works starts."""
    diagnostics: list[dict[str, Any]] = []
    builds: list[int] = []
    session = SessionConfig(id="s", agent_id="a", kind="cattle", cwd=str(tmp_path), state_dir=str(tmp_path))
    config = AdapterConfig(
        session=session,
        execution=ExecutionConfig(revision="r", runtime="acp"),
        state_dir=tmp_path,
        project_root=tmp_path,
    )
    ports, _, _ = recording_ports(tmp_path)

    def build() -> Adapter:
        builds.append(1)
        if len(builds) in (2, 3):  # the first replacement and its first retry cannot be built
            raise FileExistsError(17, "File exists", "providers/acp/home")
        return ScriptedAdapter(config, ports)

    async with supervised(tmp_path, diagnostics, build=build) as sup:
        await sup.boot()
        first = await sup.ready()
        first.exited.set()  # type: ignore[attr-defined]
        sup.lost(first, "the provider exited", crashed=True)
        await wait_codes(diagnostics, "provider.restarted")
        failed = [d for d in diagnostics if d["code"] == "provider.start_failed"]
        assert len(failed) == 2
        assert "FileExistsError" in failed[0]["message"] and "could not be prepared" in failed[0]["message"]
        assert "driver.internal_error" not in codes(diagnostics)  # a failed start, not a bug
        delays = [d["details"]["delay_ms"] for d in diagnostics if d["code"] == "provider.restarting"]
        assert delays == [0, 10, 20]  # backed off like any failed start
        assert len(builds) == 4
        assert (await sup.ready()) is ScriptedAdapter.instances[-1]


async def test_a_first_build_that_raises_does_not_raise_out_of_the_constructor(tmp_path: Path) -> None:
    diagnostics: list[dict[str, Any]] = []
    calls: list[int] = []
    session = SessionConfig(id="s", agent_id="a", kind="cattle", cwd=str(tmp_path), state_dir=str(tmp_path))
    config = AdapterConfig(
        session=session,
        execution=ExecutionConfig(revision="r", runtime="acp"),
        state_dir=tmp_path,
        project_root=tmp_path,
    )
    ports, _, _ = recording_ports(tmp_path)

    def build() -> Adapter:
        calls.append(1)
        if len(calls) == 1:
            raise NotADirectoryError(20, "Not a directory", "providers/acp/home")
        return ScriptedAdapter(config, ports)

    async with supervised(tmp_path, diagnostics, build=build) as sup:
        await sup.boot()
        with pytest.raises(ProviderError) as failed:
            await sup.ready()
        assert failed.value.code == "provider.start_failed"
        await wait_codes(diagnostics, "provider.restarted")
        assert (await sup.ready()) is ScriptedAdapter.instances[-1]
