"""The kernel's side of the model proxy: built when `execution.model_proxy` is set (PROTOCOL §6.7).

It owns the proxy, rewrites each new provider's environment and execution snapshot (fresh
placeholders per provider process), reports `model.usage`, gives a run its usage when the run ends,
and ends a run whose budget is used with `run.failed{budget.exceeded}`.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from driver import agent_files, logs
from driver.adapters.common.base import ProviderError, TurnOutcome
from driver.agent_files import AgentFileError
from driver.model_proxy import kept, plan
from driver.model_proxy.budget import Exceeded, Ledger
from driver.model_proxy.server import ModelProxy, UsageRecord
from driver.protocol.boot import ExecutionConfig
from driver.telemetry import sockowner

if TYPE_CHECKING:
    from driver.kernel.core import Kernel
    from driver.kernel.runs import Run

log = logs.get("driver.model_proxy")

# After a budget refusal: how long the provider gets to end its turn after being interrupted,
# before the kernel ends the run without it.
BUDGET_END_GRACE_S = 10.0
BUDGET_EXCEEDED = "budget.exceeded"


# Bound on the agent's CODEX_HOME/config.toml the driver copies (a config is a few KiB).
MAX_CODEX_CONFIG_BYTES = 1024 * 1024
PROXIED_HOME = "codex-home-proxied"
SESSIONS = "sessions"
# How long a run's terminal waits for the `model.usage` events already charged to it to be admitted.
USAGE_DRAIN_S = 10.0
# The journal text holding the ledger's figures (driver/model_proxy/budget.py: `Ledger.snapshot`).
LEDGER_KEY = "model_proxy.ledger"
# Ended runs remembered for attribution (start and end on the boot clock); a process started during
# an older one is attributed by today's rule.
ENDED_RUNS_KEPT = 1024
# An owner lookup that took longer than this is logged (debug): it runs off the event loop.
SLOW_LOOKUP_S = 0.001


class ProxyRoom:
    def __init__(self, kernel: Kernel) -> None:
        self.k = kernel
        execution = kernel.boot.execution
        assert execution.model_proxy is not None
        self.secrets = plan.secret_values(execution)
        logs.REDACTOR.add(self.secrets.values())
        # The only decision taken about the agent's CODEX_HOME: whether the payload names one. Its
        # config is read (as data) for each new provider; routes come from the payload alone.
        self._codex_source = _codex_home_source(execution)
        self.routes = plan.routes(execution)
        self.ledger = Ledger(execution.model_proxy.budget)
        self._restore_ledger()
        self._ledger_lock = anyio.Lock()
        # run id -> `model.usage` events charged to it and not yet admitted (a terminal waits for them).
        self._pending: dict[str, int] = {}
        self._drained = anyio.Event()
        # PROTOCOL §8.2: a kept provider calls the port and presents the placeholder it was started with
        # (driver/model_proxy/kept.py). `_kept_by`: the keeper whose provider's placeholders are accepted.
        self._state_dir = Path(kernel.boot.session.state_dir)
        self._keeps = execution.reattach_grace_ms > 0
        saved = kept.read(self._state_dir) if self._keeps else None
        self._kept_by = saved.keeper_nonce if saved is not None else None
        self._placeholders: dict[str, str] = {}  # the newest provider's (secret name -> placeholder)
        # Attribution (§6.7): when the current provider was up (its own processes started before), and
        # the runs that have ended, as (run_id, started, ended) on the boot clock.
        self._ready_s: float | None = None
        self._ended: collections.deque[tuple[str, float, float]] = collections.deque(maxlen=ENDED_RUNS_KEPT)
        self.proxy = ModelProxy(
            self.routes,
            self.secrets,
            self.ledger,
            bindings=plan.bindings(execution, list(self.secrets)),
            attribution=self,
            current_run=self.current_run,
            on_usage=self.on_usage,
            on_exceeded=self.on_exceeded,
            port=saved.port if saved is not None else 0,
        )
        if saved is not None:
            self.proxy.keep(saved.digests, kept.digest)
            if self.proxy.listener.port != saved.port:
                log.warning("model_proxy.address_changed", port=self.proxy.listener.port, recorded=saved.port)

    # -- providers ------------------------------------------------------------------------------------
    def adapt(
        self, env: dict[str, str], execution: ExecutionConfig, provider_dir: Path
    ) -> tuple[dict[str, str], ExecutionConfig]:
        """A new provider process: fresh placeholders, and its environment and snapshot rewritten."""
        placeholders = self.proxy.rotate()
        self._placeholders = placeholders
        logs.REDACTOR.add(placeholders.values())
        url = self.proxy.url
        codex_home: str | None = None
        if self._codex_source is not None:
            try:
                codex_home = self._codex_home(provider_dir, url)
            except (OSError, AgentFileError) as exc:
                # The agent keeps its own CODEX_HOME: it calls the upstream with a placeholder, which
                # the upstream refuses; the key itself is still withheld.
                log.error("model_proxy.codex_home_failed", error=f"{type(exc).__name__}: {exc}")
        env = plan.provider_environment(env, self.secrets, placeholders, url)
        if codex_home is not None and "CODEX_HOME" in env:
            env["CODEX_HOME"] = codex_home
        execution = plan.provider_execution(execution, self.secrets, placeholders, url, codex_home)
        return env, execution

    def _codex_home(self, provider_dir: Path, url: str) -> str | None:
        """A copy of the agent's CODEX_HOME whose config.toml names the proxy's `/openai` route: every
        other entry is a symlink to the original (sessions, auth, skills stay where they are).

        Both folders are the agent's: the config is read bounded and without following a link, the
        copy is written through `agent_files` (a fresh name, then a rename; no planted link is
        followed), and the links are made relative to the copy's directory descriptor."""
        source = self._codex_source
        assert source is not None
        try:
            raw = agent_files.read_file(source, "config.toml", max_bytes=MAX_CODEX_CONFIG_BYTES)
            text = raw.decode("utf-8")
        except AgentFileError as exc:
            if "no such file" in str(exc):
                return None
            raise
        except UnicodeDecodeError:
            raise AgentFileError(f"{source / 'config.toml'}: not UTF-8") from None
        # The provider's sessions stay in the agent's home, where the checkpoint recorder reads and
        # restores them (PROTOCOL §8.1): a missing `sessions/` is made there, so the copy links it
        # rather than codex-acp making its own in the copy. A file standing there is the agent's
        # (left as it is: then there is no checkpoint, as without the proxy).
        with contextlib.suppress(AgentFileError):
            agent_files.make_folder(source, SESSIONS)
        state_dir = Path(self.k.boot.session.state_dir)
        relative = provider_dir.relative_to(state_dir) / PROXIED_HOME
        agent_files.make_folder(state_dir, relative)
        folder = agent_files.open_folder(state_dir, relative)
        try:
            with os.scandir(source) as entries:
                names = [e.name for e in entries if e.name != "config.toml" and not e.name.startswith(".config.toml.")]
            for name in names[:4096]:
                try:
                    os.lstat(name, dir_fd=folder)
                    continue  # already there (a link of ours, or the agent's own: left as it is)
                except FileNotFoundError:
                    pass
                with contextlib.suppress(FileExistsError):
                    os.symlink(source / name, name, dir_fd=folder)
        finally:
            os.close(folder)
        agent_files.write_file(
            state_dir, relative / "config.toml", plan.rewrite_codex_config(text, f"{url}/openai").encode()
        )
        return str(state_dir / relative)

    async def provider_started(self) -> None:
        """An adapter started. Attached to the keeper whose placeholders are accepted: they stay so.
        Otherwise its provider is a fresh one: the kept generation stops working, and when this provider
        is kept, its own port and placeholders are recorded for the next driver process."""
        # Every process of this provider's tree started until now is the provider's own (the runtime,
        # and what it starts with its session: claude-agent-acp's Claude CLI).
        self._ready_s = sockowner.boot_seconds()
        if not self._keeps:
            return
        nonce = await anyio.to_thread.run_sync(kept.current_keeper, self._state_dir)
        if nonce is not None and nonce == self._kept_by:
            return
        self._kept_by = None
        self.proxy.drop_kept()
        if nonce is None:
            await anyio.to_thread.run_sync(kept.forget, self._state_dir)
            return
        port, placeholders = self.proxy.listener.port, dict(self._placeholders)
        await anyio.to_thread.run_sync(kept.remember, self._state_dir, port, placeholders, nonce)

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

    # -- attribution (§6.7): the process that holds a connection's client socket -------------------------
    async def identify(self, client_port: int, server_port: int) -> object:
        """The provider-tree process holding the client end of a new connection, from the kernel's
        tables, off the event loop; None (today's rule, said at debug) when it cannot be found."""
        try:
            roots = list(self.k.adapter.process_group_ids())
        except Exception:
            roots = []
        started = time.monotonic()
        owner = await anyio.to_thread.run_sync(sockowner.find_owner, client_port, server_port, roots)
        took = time.monotonic() - started
        if owner is None:
            log.debug("model_proxy.owner_unknown", client_port=client_port, ms=round(took * 1000, 2))
        elif took > SLOW_LOOKUP_S:
            log.debug("model_proxy.owner_lookup", pid=owner.pid, ms=round(took * 1000, 2))
        return owner

    def ended_run(self, origin: object) -> str | None:
        """The ended run during which the origin's process was started, when it was started after the
        provider was up and during that run; None otherwise (the run active now pays, as before)."""
        if not isinstance(origin, sockowner.Owner) or self._ready_s is None or origin.started_s < self._ready_s:
            return None
        active = self._active_run()
        if active is not None and origin.started_s >= active.started_boot_s:
            return None
        for run_id, started, ended in reversed(self._ended):
            if started <= origin.started_s <= ended:
                return run_id
            if ended < origin.started_s:
                break  # the runs are in order: the process started between two runs
        return None

    # -- the ledger across driver processes (PROTOCOL §8.2) --------------------------------------------
    def _restore_ledger(self) -> None:
        """A predecessor's figures on this state_dir (the journal's text is MAC'd like every row)."""
        raw = self.k.journal.text(LEDGER_KEY)
        if raw is None:
            return
        try:
            restored = self.ledger.restore(json.loads(raw))
        except ValueError:
            restored = False
        if restored:
            spent = self.ledger.session
            log.info("model_proxy.ledger_restored", requests=spent.requests, cost_usd=round(spent.cost_usd, 6))
        else:
            log.warning("model_proxy.ledger_unreadable")

    async def _journal_ledger(self) -> None:
        """Journal the figures as they are now, before the usage is reported: a crash after this cannot
        forget the charge (one between the upstream's answer and here can: the requests then settling).
        Under a lock, the snapshot taken once it is held: two settles never leave the older figures last."""
        try:
            async with self._ledger_lock:
                text = json.dumps(self.ledger.snapshot(), separators=(",", ":"))
                await anyio.to_thread.run_sync(self.k.journal.set_text, LEDGER_KEY, text)
        except Exception as exc:  # a journal that fails is the journal's to report; the usage still goes out
            log.warning("model_proxy.ledger_not_journaled", error=f"{type(exc).__name__}: {exc}")

    async def on_usage(self, record: UsageRecord) -> None:
        """One `model.usage` (lossless). Charged to its run (still open: the ledger said so in the same
        step as the charge), it is one of that run's events, admitted before its terminal (`settle`
        waits for it); otherwise it is the session's: not run-scoped, its payload still naming the run
        that was active when the request started."""
        payload = record.payload()
        run_id = record.run_id
        if not record.charged_to_run or run_id is None:
            await self._journal_ledger()
            await self.k.emit("model.usage", payload)
            return
        # Counted before the first await: the run's settle cannot miss it.
        self._pending[run_id] = self._pending.get(run_id, 0) + 1
        try:
            await self._journal_ledger()
            run = self._active_run()
            if run is not None and run.run_id == run_id:
                run.last_activity = time.monotonic()
            await self.k.runs.emit_for_run(run_id, "model.usage", payload)
        finally:
            self._pending[run_id] -= 1
            if not self._pending[run_id]:
                del self._pending[run_id]
                self._drained.set()

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

    async def settle(
        self, run: Run, outcome: TurnOutcome | None, error: ProviderError | None
    ) -> tuple[TurnOutcome | None, ProviderError | None]:
        """The run's terminal is being chosen: its usage is fixed now (later spending is the
        session's), once every `model.usage` already charged to it is admitted."""
        usage = self.ledger.close_run(run.run_id)
        self._ended.append((run.run_id, run.started_boot_s, sockowner.boot_seconds()))
        with anyio.move_on_after(USAGE_DRAIN_S):
            while run.run_id in self._pending:
                self._drained = anyio.Event()
                await self._drained.wait()
        return settle(run, outcome, error, usage)

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
    """The CODEX_HOME the payload gives an ACP agent (codex-acp reads its provider from there)."""
    if execution.runtime != "acp":
        return None
    env = {**execution.environment, **(execution.acp.env if execution.acp else {})}
    value = env.get("CODEX_HOME")
    if not value:
        return None
    return Path(value)
