"""Per ACP agent: spawn to ready, time to first token, cancel to cancelled (p50/p95 over N runs).

Drives the REAL `AcpAdapter` directly with the in-memory ports of lab/agent_lab/testing/ports.py (no kernel,
no link), so the figures are the adapter's plus the agent's, nothing else:
- spawn → ready: `await adapter.start()` (process spawn, initialize, session/new), a fresh adapter
  and a fresh state directory each time;
- time to first token: from calling `adapter.run()` with a plain prompt to the first `message.delta`
  reaching the events port (one started adapter; one warm-up turn not counted);
- cancel → cancelled: a `[[slow]]` run; `adapter.cancel()` right after its first delta; until `run()`
  returns the cancelled outcome.

Agents: codex-acp and claude-agent-acp, offline against the fake model endpoints (lab/agent_lab/testing),
and our stubborn agent (tests/helpers/stubborn_acp_agent.py, no model) as the floor: what our ACP
client and a Python agent process cost by themselves. Its cancel figure is bounded below by its own
50 ms sleep between `[[slow]]` chunks (it looks at the cancel only between chunks), not by the client.

`python -m agent_lab.bench.acp_agents [--runs N] [--only NAME ...]`. Exit status 1 only if a measurement crashed.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import anyio

from agent_lab.bench._common import ROOT, STUBBORN, percentile, table

CLAUDE_ACP = ROOT / "node_modules" / "@agentclientprotocol" / "claude-agent-acp" / "dist" / "index.js"
CODEX_ACP = ROOT / "node_modules" / "@zed-industries" / "codex-acp-linux-x64" / "bin" / "codex-acp"
AGENTS = ("stubborn", "codex-acp", "claude-agent-acp")
RUNS = 10
TURN_TIMEOUT = 60.0


class TimedEvents:
    """The recording events port, plus the moment of the first `message.delta` of the current turn."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.first_delta: float | None = None
        self.delta_seen = anyio.Event()

    def reset(self) -> None:
        self.first_delta = None
        self.delta_seen = anyio.Event()
        self.inner.events.clear()  # 10+ turns of deltas need not pile up

    async def emit(self, kind: str, payload: dict[str, Any]) -> None:
        # Clocked on entry, before the schema validation the recording port does.
        if kind == "message.delta" and self.first_delta is None:
            self.first_delta = time.perf_counter()
            self.delta_seen.set()
        await self.inner.emit(kind, payload)


@dataclasses.dataclass(frozen=True)
class AgentSpec:
    command: list[str]
    env: dict[str, str]  # execution.acp.env: agent-specific settings
    environment: dict[str, str]  # execution.environment: credentials


Spec = Callable[[Path], AgentSpec]  # state dir → how to run the agent there


def _adapter(tmp: Path, spec: Spec) -> tuple[Any, TimedEvents]:
    from agent_lab.testing.ports import recording_ports
    from driver.adapters.acp.adapter import AcpAdapter
    from driver.adapters.common.base import AdapterConfig
    from driver.adapters.common.environment import provider_env
    from driver.protocol.boot import AcpConfig, ExecutionConfig, SessionConfig

    cwd, state = tmp / "ws", tmp / "state"
    cwd.mkdir(parents=True, exist_ok=True)
    state.mkdir(parents=True, exist_ok=True)
    agent = spec(state)
    execution = ExecutionConfig(
        revision="rev-bench",
        runtime="acp",
        permission_policy="full_access",  # plain text and a cancel: no approvals wanted
        environment=agent.environment,
        acp=AcpConfig(command=agent.command, env=agent.env),
    )
    session = SessionConfig(id="ses-bench", agent_id="agt-bench", kind="cattle", cwd=str(cwd), state_dir=str(state))
    config = AdapterConfig(
        session=session,
        execution=execution,
        state_dir=state,
        project_root=ROOT,
        env=provider_env(execution.environment, home=str(state)),
    )
    ports, recording, _ = recording_ports(cwd)
    timed = TimedEvents(recording)
    return AcpAdapter(config, dataclasses.replace(ports, events=timed)), timed


# ---- the agents ---------------------------------------------------------------------------------


def _stubborn(state: Path) -> AgentSpec:
    return AgentSpec([sys.executable, str(STUBBORN), "normal"], {}, {})


def _codex(base_url: str) -> Spec:
    from agent_lab.testing import codex_acp

    def spec(state: Path) -> AgentSpec:
        home = codex_acp.write_home(state / "codex", base_url, "FAKE_OPENAI_API_KEY")
        # codex-acp refuses to install its sandbox helper when CODEX_HOME is under TMPDIR.
        (state / "tmp").mkdir(exist_ok=True)
        env = {"CODEX_HOME": str(home), "TMPDIR": str(state / "tmp")}
        return AgentSpec([str(CODEX_ACP)], env, {"FAKE_OPENAI_API_KEY": "sk-fake-openai-0123456789"})

    return spec


def _claude(base_url: str) -> Spec:
    def spec(state: Path) -> AgentSpec:
        env = {
            "ANTHROPIC_BASE_URL": base_url,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "CLAUDE_CONFIG_DIR": str(state / "claude"),
            "CLAUDE_CODE_MAX_RETRIES": "0",
            "IS_SANDBOX": "1",  # bypassPermissions (full_access) is refused as root otherwise
        }
        return AgentSpec(["node", str(CLAUDE_ACP)], env, {"ANTHROPIC_API_KEY": "sk-ant-fake-0123456789"})

    return spec


@contextmanager
def _agent_spec(name: str) -> Iterator[Spec]:
    """The agent's spec with its fake model endpoint running; FileNotFoundError if not installed."""
    if name == "stubborn":
        yield _stubborn
    elif name == "codex-acp":
        if not CODEX_ACP.exists():
            raise FileNotFoundError(CODEX_ACP)
        from agent_lab.testing.fake_responses import FakeResponses

        with FakeResponses() as fake:
            yield _codex(fake.base_url)
    else:
        if not CLAUDE_ACP.exists():
            raise FileNotFoundError(CLAUDE_ACP)
        from agent_lab.testing.fake_anthropic import FakeAnthropic

        with FakeAnthropic() as fake_a:
            yield _claude(fake_a.base_url)


# ---- the measurements -----------------------------------------------------------------------------


async def _spawn_ms(tmp: Path, spec: Spec) -> float:
    adapter, _ = _adapter(tmp, spec)
    try:
        t0 = time.perf_counter()
        with anyio.fail_after(TURN_TIMEOUT):
            await adapter.start()
        return (time.perf_counter() - t0) * 1000
    finally:
        with anyio.fail_after(15):
            await adapter.stop()


async def _ttft_ms(adapter: Any, events: TimedEvents, run_id: str) -> float:
    from driver.protocol.commands import RunInput

    events.reset()
    t0 = time.perf_counter()
    with anyio.fail_after(TURN_TIMEOUT):
        outcome = await adapter.run(run_id, RunInput(text="[[say:Hello from the benchmark, in a few chunks.]]"))
    if outcome.status != "completed" or events.first_delta is None:
        raise RuntimeError(f"{run_id}: ended {outcome.status} ({outcome.error_message}) or without a delta")
    return (events.first_delta - t0) * 1000


async def _cancel_ms(adapter: Any, events: TimedEvents, run_id: str) -> float:
    from driver.protocol.commands import RunInput

    events.reset()
    outcome: list[Any] = []
    ended: list[float] = []

    async def go() -> None:
        outcome.append(await adapter.run(run_id, RunInput(text="[[slow]]")))
        ended.append(time.perf_counter())

    # The [[slow]] reply lasts ~20 s: a lost cancel shows up as a timeout, not as a fast figure.
    with anyio.fail_after(TURN_TIMEOUT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(go)
            await events.delta_seen.wait()
            t0 = time.perf_counter()
            await adapter.cancel()
    if outcome[0].status != "cancelled":
        raise RuntimeError(f"{run_id}: ended {outcome[0].status}, not cancelled")
    return (ended[0] - t0) * 1000


async def _measure(name: str, runs: int, tmp: Path) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {"spawn": [], "ttft": [], "cancel": []}
    with _agent_spec(name) as spec:
        for i in range(runs):
            results["spawn"].append(await _spawn_ms(tmp / f"spawn-{i}", spec))
        adapter, events = _adapter(tmp / "turns", spec)
        with anyio.fail_after(TURN_TIMEOUT):
            await adapter.start()
        try:
            await _ttft_ms(adapter, events, "run-warmup")  # first turn: caches, lazy loads
            for i in range(runs):
                results["ttft"].append(await _ttft_ms(adapter, events, f"run-t{i}"))
            for i in range(runs):
                results["cancel"].append(await _cancel_ms(adapter, events, f"run-c{i}"))
        finally:
            with anyio.fail_after(15):
                await adapter.stop()
    return results


METRICS = (("spawn", "spawn → ready"), ("ttft", "time to first token"), ("cancel", "cancel → cancelled"))


async def _main(runs: int, names: list[str]) -> int:
    from driver import logs

    logs.configure("error")
    rows: list[list[Any]] = []
    crashed = False
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-acp-")))
        for name in names:
            t0 = time.monotonic()
            try:
                results = await _measure(name, runs, tmp / name)
            except FileNotFoundError as exc:
                print(f"{name}: not measured: not installed ({exc})")
                continue
            except Exception:
                print(f"{name}: CRASHED:\n{traceback.format_exc()}", file=sys.stderr)
                crashed = True
                continue
            print(f"{name}: measured in {time.monotonic() - t0:.0f} s", flush=True)
            for key, label in METRICS:
                values = results[key]
                rows.append([name, label, percentile(values, 50), percentile(values, 95), len(values)])
    table(
        f"ACP agents through the real AcpAdapter, ms ({runs} runs each; TTFT after one warm-up turn)",
        ["agent", "metric", "p50", "p95", "n"],
        rows,
    )
    if "stubborn" in names:
        print("  (stubborn: no model; its cancel → cancelled includes its own 50 ms sleep between chunks)")
    return 1 if crashed else 0


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m agent_lab.bench.acp_agents")
    parser.add_argument("--runs", type=int, default=RUNS)
    parser.add_argument("--only", nargs="+", choices=AGENTS, default=list(AGENTS))
    args = parser.parse_args()
    sys.exit(anyio.run(_main, args.runs, args.only))


if __name__ == "__main__":
    main()
