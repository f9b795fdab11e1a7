"""The kernel's side of the model proxy: built when `execution.model_proxy` is set (PROTOCOL §6.7).

It owns the proxy, rewrites each new provider's environment and execution snapshot (fresh
placeholders per provider process), reports `model.usage`, gives a run its usage when the run ends,
and ends a run whose budget is used with `run.failed{budget.exceeded}`.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from driver import logs
from driver.adapters.base import ProviderError, TurnOutcome
from driver.model_proxy import plan
from driver.model_proxy.budget import Exceeded, Ledger
from driver.model_proxy.server import ModelProxy, UsageRecord
from driver.protocol.boot import ExecutionConfig

if TYPE_CHECKING:
    from driver.kernel.core import Kernel
    from driver.runs import Run

log = logs.get("driver.model_proxy")

# After a budget refusal: how long the provider gets to end its turn after being interrupted,
# before the kernel ends the run without it.
BUDGET_END_GRACE_S = 10.0
BUDGET_EXCEEDED = "budget.exceeded"


class ProxyRoom:
    def __init__(self, kernel: Kernel) -> None:
        self.k = kernel
        execution = kernel.boot.execution
        assert execution.model_proxy is not None
        self.secrets = plan.secret_values(execution)
        logs.REDACTOR.add(self.secrets.values())
        self._codex_source = _codex_home_source(execution)
        self._codex_text = _read(self._codex_source / "config.toml") if self._codex_source else None
        self._codex_urls = plan.codex_home_urls(self._codex_text) if self._codex_text else []
        self.routes = plan.routes(execution, self._codex_urls)
        self.ledger = Ledger(execution.model_proxy.budget)
        self.proxy = ModelProxy(
            self.routes,
            self.secrets,
            self.ledger,
            current_run=self.current_run,
            on_usage=self.on_usage,
            on_exceeded=self.on_exceeded,
        )

    # -- providers ------------------------------------------------------------------------------------
    def adapt(
        self, env: dict[str, str], execution: ExecutionConfig, provider_dir: Path
    ) -> tuple[dict[str, str], ExecutionConfig]:
        """A new provider process: fresh placeholders, and its environment and snapshot rewritten."""
        placeholders = self.proxy.rotate()
        logs.REDACTOR.add(placeholders.values())
        url = self.proxy.url
        codex_home: str | None = None
        if self._codex_text is not None:
            try:
                codex_home = self._codex_home(provider_dir, url)
            except OSError as exc:
                # The agent keeps its own CODEX_HOME: it calls the upstream with a placeholder, which
                # the upstream refuses; the key itself is still withheld.
                log.error("model_proxy.codex_home_failed", error=f"{type(exc).__name__}: {exc.strerror}")
        env = plan.provider_environment(env, self.secrets, placeholders, url)
        if codex_home is not None and "CODEX_HOME" in env:
            env["CODEX_HOME"] = codex_home
        execution = plan.provider_execution(execution, self.secrets, placeholders, url, codex_home)
        return env, execution

    def _codex_home(self, provider_dir: Path, url: str) -> str:
        """A copy of the agent's CODEX_HOME whose config.toml names the proxy: every other entry is a
        symlink to the original (sessions, auth, skills stay where they are)."""
        assert self._codex_source is not None and self._codex_text is not None
        home = provider_dir / "codex-home-proxied"
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
        for entry in self._codex_source.iterdir():
            link = home / entry.name
            if entry.name == "config.toml" or link.exists() or link.is_symlink():
                continue
            os.symlink(entry, link)
        index = {u: i for i, u in enumerate(self._codex_urls)}
        text = plan.rewrite_codex_config(
            self._codex_text, lambda u: f"{url}/codex-home-{index[u]}" if u in index else None
        )
        tmp = home / "config.toml.tmp"
        tmp.write_text(text)
        tmp.replace(home / "config.toml")
        return str(home)

    async def start(self) -> None:
        await self.proxy.start()
        log.info("model_proxy.started", url=self.proxy.url, routes=sorted(self.routes))

    async def close(self) -> None:
        await self.proxy.close()

    # -- runs -----------------------------------------------------------------------------------------
    def _active_run(self) -> Run | None:
        run = self.k.run
        return run if run is not None and run.terminal is None else None

    def current_run(self) -> str | None:
        run = self._active_run()
        return run.run_id if run is not None else None

    async def on_usage(self, record: UsageRecord) -> None:
        """One `model.usage` (lossless). With its run still open it belongs to that run's events; a
        request that outlived its run (an abandoned stream) is reported outside any run, its payload
        still naming the run."""
        payload = record.payload()
        run = self._active_run()
        if run is not None and run.run_id == record.run_id:
            run.last_activity = time.monotonic()
            await self.k.runs.emit_for_run(run.run_id, "model.usage", payload)
        else:
            await self.k.emit("model.usage", payload)

    def on_exceeded(self, run_id: str | None, exceeded: Exceeded) -> None:
        run = self._active_run()
        if run is None or run.run_id != run_id or run.forced_error is not None:
            return
        run.forced_error = ProviderError(BUDGET_EXCEEDED, exceeded.message, retryable=False, details=exceeded.details())
        log.warning("model_proxy.budget_exceeded", run_id=run.run_id, limit=exceeded.limit)
        self.k.spawn(self._end_run, run)

    async def _end_run(self, run: Run) -> None:
        """Interrupt the provider; a provider that does not end its turn in time is cut off."""
        adapter = run.adapter
        if adapter is not None:
            try:
                with anyio.move_on_after(BUDGET_END_GRACE_S / 2):
                    await adapter.cancel()
            except Exception as exc:
                log.warning("model_proxy.interrupt_failed", error=f"{type(exc).__name__}: {exc}")
        with anyio.move_on_after(BUDGET_END_GRACE_S):
            await run.ended.wait()
            return
        run.scope.cancel()

    def settle(
        self, run: Run, outcome: TurnOutcome | None, error: ProviderError | None
    ) -> tuple[TurnOutcome | None, ProviderError | None]:
        return settle(run, outcome, error, self.ledger.run(run.run_id).as_usage())

    def run_spent(self, run_id: str) -> dict[str, Any]:
        return self.ledger.run(run_id).as_usage()


def settle(
    run: Run, outcome: TurnOutcome | None, error: ProviderError | None, usage: dict[str, Any]
) -> tuple[TurnOutcome | None, ProviderError | None]:
    """At the run's end: a used budget wins over what the provider made of the refusal (a cancelled
    turn, an API error, a reply), unless the CP asked for a cancel first; a completed run's usage is
    the proxy's figures."""
    forced = run.forced_error
    if forced is not None and forced.code == BUDGET_EXCEEDED and run.cancel_requested_by is None:
        return None, forced
    if outcome is not None and outcome.status == "completed":
        outcome = dataclasses.replace(outcome, usage=usage)
    return outcome, error


def _codex_home_source(execution: ExecutionConfig) -> Path | None:
    """The CODEX_HOME an ACP agent is given (codex-acp reads its provider from there), if it has a config."""
    if execution.runtime != "acp":
        return None
    env = {**execution.environment, **(execution.acp.env if execution.acp else {})}
    value = env.get("CODEX_HOME")
    if not value:
        return None
    path = Path(value)
    return path if (path / "config.toml").is_file() else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None
