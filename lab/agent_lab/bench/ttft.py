"""Time to first token: through the driver against the same provider driven directly.

Both sides talk to the same fake model endpoint (lab/agent_lab/testing), started in this process.
- Claude: `ClaudeSDKClient` directly (connected once; clock from `query()` to the first text delta)
  vs the `agent-driver run` process with the `claude-agent-sdk` runtime (clock from the control
  plane putting `input.start` on the wire to the first `message.delta` frame arriving there).
- Codex: the Codex binary's `app-server` driven directly through our `JsonRpcPeer` (clock from
  `turn/start` to the first `item/agentMessage/delta`) vs the driver with the `openai-app-server`
  runtime, clocked as above.
One warm-up turn each, then RUNS turns alternating direct and driven; the figure is the median (p50)
and the goal is on the difference of medians.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio

from agent_lab.bench._common import INSTANCE, ROOT, TOKEN, driver_env, goal, median, table
from agent_lab.bench._common import boot_payload as make_payload

RUNS = 10
PROMPT = "hello"


# -- through the driver ----------------------------------------------------------------------------

Turn = Callable[[], Awaitable[float]]  # one turn; returns its time to first token in ms


@asynccontextmanager
async def through_driver(tmp: Path, runtime: str, execution: dict[str, Any]) -> AsyncIterator[Turn]:
    """Turns from `input.start` on the wire to the first `message.delta` frame received, in ms."""
    from agent_lab.controlplane.server import ControlPlane

    tmp.mkdir(parents=True, exist_ok=True)
    async with ControlPlane(tmp / "cp.sqlite3", tokens={TOKEN: {INSTANCE}}, http_port=None) as cp:
        watching: dict[str, float] = {}  # the run id being clocked → first delta time (0 until seen)
        on_frame = cp._on_frame

        async def timed(link: Any, raw: str | bytes) -> bool:
            if watching and isinstance(raw, str) and '"kind":"message.delta"' in raw:
                for run_id, seen in watching.items():
                    if not seen and f'"run_id":"{run_id}"' in raw:
                        watching[run_id] = time.perf_counter()
            return await on_frame(link, raw)

        cp._on_frame = timed  # type: ignore[method-assign]
        # The clock starts when the command frame goes on the wire, not when the CP stores it.
        sent: dict[str, float] = {}
        send_command = cp._send_command

        async def timed_send(link: Any, cmd: dict[str, Any]) -> None:
            sent.setdefault(cmd["command_id"], time.perf_counter())
            await send_command(link, cmd)

        cp._send_command = timed_send  # type: ignore[method-assign]
        boot = tmp / "boot.json"
        boot.write_text(json.dumps(make_payload(tmp, cp.url, runtime=runtime, **execution)))
        boot.chmod(0o600)
        proc = _spawn_driver(boot, tmp / "driver.stderr")
        turns = 0

        async def turn() -> float:
            nonlocal turns
            turns += 1
            run_id = f"run-{turns}"
            watching.clear()
            watching[run_id] = 0.0
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id=run_id, input={"text": PROMPT})
            status = await cp.wait_for_command_status(cid, timeout=60)
            if status["status"] != "completed" or not watching[run_id]:
                raise RuntimeError(f"{runtime}: turn {run_id} ended {status['status']} without a delta")
            return (watching[run_id] - sent[cid]) * 1000

        try:
            started = await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=120)
            if started["payload"]["timings"]["provider_start_ms"] is None:
                raise RuntimeError(f"{runtime}: the provider did not start; see {tmp / 'driver.stderr'}")
            yield turn
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


def _spawn_driver(boot: Path, stderr: Path) -> subprocess.Popen[bytes]:
    with stderr.open("wb") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "driver.cli", "run", "--boot-file", str(boot), "--log-level", "warning"],
            cwd=ROOT,
            env=driver_env(),
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )


# -- Claude directly ---------------------------------------------------------------------------------


@asynccontextmanager
async def claude_direct(tmp: Path, base_url: str) -> AsyncIterator[Turn]:
    import claude_agent_sdk as sdk

    from driver.adapters.claude.options import provider_environment
    from driver.adapters.common.environment import provider_env

    state, cwd = tmp / "state", tmp / "cwd"
    for d in (state / "home", cwd):
        d.mkdir(parents=True, exist_ok=True)
    base = provider_env(_claude_env(base_url), home=str(state / "home"), traceparent=None)
    options = sdk.ClaudeAgentOptions(
        cwd=str(cwd),
        model="claude-sonnet-4-5",
        include_partial_messages=True,
        setting_sources=[],
        env=provider_environment(base, state),
        permission_mode="bypassPermissions",
    )
    client = sdk.ClaudeSDKClient(options)
    await client.connect()

    async def turn() -> float:
        first: float | None = None
        t0 = time.perf_counter()
        await client.query(PROMPT)
        async for message in client.receive_response():
            if first is None and isinstance(message, sdk.StreamEvent):
                ev = message.event
                if ev.get("type") == "content_block_delta" and ev.get("delta", {}).get("type") == "text_delta":
                    first = time.perf_counter()
        if first is None:
            raise RuntimeError("claude: a turn ended without a text delta")
        return (first - t0) * 1000

    try:
        yield turn
    finally:
        await client.disconnect()


def _claude_env(base_url: str) -> dict[str, str]:
    return {"ANTHROPIC_BASE_URL": base_url, "ANTHROPIC_API_KEY": "sk-ant-bench-fake"}


# -- Codex directly ----------------------------------------------------------------------------------


def _codex_execution(base_url: str) -> dict[str, Any]:
    return {
        "model": "gpt-5.5",
        "environment": {"OPENAI_API_KEY": "sk-bench-fake"},
        "provider_options": {"base_url": base_url, "env_key": "OPENAI_API_KEY"},
    }


@asynccontextmanager
async def codex_direct(tmp: Path, base_url: str) -> AsyncIterator[Turn]:
    import msgspec

    from driver.adapters.codex.config import render_config, settings_from
    from driver.adapters.codex.files import codex_binary
    from driver.adapters.common.environment import provider_env
    from driver.adapters.common.jsonrpc import JsonRpcPeer
    from driver.adapters.common.process import ProviderProcess
    from driver.protocol.boot import ExecutionConfig

    fields = _codex_execution(base_url)
    execution = msgspec.convert(
        {"revision": "r", "runtime": "openai-app-server", "permission_policy": "full_access", **fields},
        ExecutionConfig,
    )
    settings = settings_from(execution)
    text, extra_env = render_config(settings)
    home, cwd = tmp / "codex-home", tmp / "cwd"
    for d in (home, cwd):
        d.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(text)
    env = {**provider_env(execution.environment, home=str(home), traceparent=None), **extra_env}
    env["CODEX_HOME"] = str(home)
    proc = await ProviderProcess.spawn([str(codex_binary(ROOT)), "app-server"], env=env, cwd=cwd, name="codex")
    first: list[float] = []
    done = anyio.Event()

    async def on_notification(method: str, params: Any) -> None:
        if method == "item/agentMessage/delta" and not first:
            first.append(time.perf_counter())
        elif method == "turn/completed":
            done.set()

    async def on_request(method: str, params: Any) -> Any:
        return {"decision": "decline"}  # no approvals are expected for a plain text turn

    peer = JsonRpcPeer(
        proc.stdout,
        proc.stdin,
        name="codex",
        jsonrpc_version=None,
        on_request=on_request,
        on_notification=on_notification,
    )
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(peer.run)
            with anyio.fail_after(60):
                await peer.request("initialize", {"clientInfo": {"name": "bench", "version": "0"}})
                await peer.notify("initialized")
                params = {"cwd": str(cwd), "model": settings.model}
                params |= {"approvalPolicy": settings.approval_policy, "sandbox": settings.sandbox}
                thread = await peer.request("thread/start", params)
            thread_id = thread["thread"]["id"]

            async def turn() -> float:
                nonlocal done
                first.clear()
                done = anyio.Event()
                t0 = time.perf_counter()
                with anyio.fail_after(60):
                    await peer.request(
                        "turn/start", {"threadId": thread_id, "input": [{"type": "text", "text": PROMPT}]}
                    )
                    await done.wait()
                if not first:
                    raise RuntimeError("codex: a turn ended without a delta")
                return (first[0] - t0) * 1000

            yield turn
            tg.cancel_scope.cancel()
    finally:
        await proc.terminate()


# -- main ----------------------------------------------------------------------------------------------


async def _pair(
    name: str, direct: AbstractAsyncContextManager[Turn], driven: AbstractAsyncContextManager[Turn]
) -> tuple[list[float], list[float]] | None:
    """Both sessions open at once; one warm-up turn each, then RUNS turns alternating direct and
    driven, so load changes on this shared machine hit both alike."""
    d: list[float] = []
    v: list[float] = []
    try:
        async with direct as direct_turn, driven as driven_turn:
            await direct_turn()
            await driven_turn()
            for _ in range(RUNS):
                d.append(await direct_turn())
                v.append(await driven_turn())
    except Exception as exc:  # a provider that cannot run here is reported, not fatal to the others
        print(f"\n{name}: not measured: {type(exc).__name__}: {exc}")
        return None
    return d, v


async def _main() -> None:
    from agent_lab.testing.fake_anthropic import FakeAnthropic
    from agent_lab.testing.fake_responses import FakeResponses
    from driver import logs

    logs.configure("error")
    rows: list[list[Any]] = []
    verdicts: list[tuple[str, float, float]] = []
    with tempfile.TemporaryDirectory(prefix="bench-ttft-") as tmp_s:
        tmp = Path(tmp_s)
        with FakeAnthropic() as fake:
            claude = await _pair(
                "claude",
                claude_direct(tmp / "claude-direct", fake.base_url),
                through_driver(
                    tmp / "claude-driver",
                    "claude-agent-sdk",
                    {"model": "claude-sonnet-4-5", "environment": _claude_env(fake.base_url)},
                ),
            )
        if claude is not None:
            d, v = claude
            rows += [
                ["Claude SDK: ClaudeSDKClient directly", *_stats(d)],
                ["Claude SDK: through the driver", *_stats(v)],
            ]
            verdicts.append(("Claude: added p50 ≤ 20 ms", median(v) - median(d), 20.0))
        try:
            from driver.adapters.codex.files import codex_binary

            codex_binary(ROOT)
            have_codex = True
        except Exception as exc:
            print(f"\ncodex: not measured: {exc}")
            have_codex = False
        if have_codex:
            with FakeResponses() as fake_r:
                codex = await _pair(
                    "codex",
                    codex_direct(tmp / "codex-direct", fake_r.base_url),
                    through_driver(tmp / "codex-driver", "openai-app-server", _codex_execution(fake_r.base_url)),
                )
            if codex is not None:
                d, v = codex
                rows += [
                    ["Codex app-server: JsonRpcPeer directly", *_stats(d)],
                    ["Codex: through the driver", *_stats(v)],
                ]
                verdicts.append(("Codex: added p50 ≤ 15 ms", median(v) - median(d), 15.0))
    table(
        f"time to first token, ms ({RUNS} turns after one warm-up; same fake endpoint)",
        ["path", "p50", "min", "max"],
        rows,
    )
    for name, added, limit in verdicts:
        goal(name, added <= limit, f"{added:+.1f} ms at p50")


def _stats(values: list[float]) -> list[float]:
    return [median(values), min(values), max(values)]


def main() -> None:
    anyio.run(_main)


if __name__ == "__main__":
    main()
