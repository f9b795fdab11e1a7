"""The keeper's cost on the event path (PROTOCOL §8.2): Codex through the driver, with and without
`reattach_grace_ms` (the provider under a keeper, its stdio relayed over a Unix socket and logged), in the
same bench run, turns interleaved. `python -m agent_lab.bench.keeper_cost acp` measures the ACP agent
codex-acp the same way.

Per turn, clocked at the control plane from `input.start` on the wire: the first `message.delta` frame
(time to first token) and the `message.completed` frame (a lossless event that follows the reply's last
model byte). The fake model streams a 400-word reply at its fast pace. Figures: p50 and p99 of each.
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
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio

from agent_lab.bench._common import INSTANCE, TOKEN, percentile, table
from agent_lab.bench._common import boot_payload as make_payload
from agent_lab.bench.ttft import _codex_execution, _spawn_driver

RUNS = 12
PROMPT = "[[say:" + " ".join(f"w{i}" for i in range(400)) + "]]"

Turn = Callable[[], Awaitable[tuple[float, float]]]


@asynccontextmanager
async def driven(tmp: Path, execution: dict[str, Any], runtime: str = "openai-app-server") -> AsyncIterator[Turn]:
    from agent_lab.controlplane.server import ControlPlane

    tmp.mkdir(parents=True, exist_ok=True)
    async with ControlPlane(tmp / "cp.sqlite3", tokens={TOKEN: {INSTANCE}}, http_port=None) as cp:
        seen: dict[str, float] = {}
        on_frame = cp._on_frame

        async def timed(link: Any, raw: str | bytes) -> bool:
            if isinstance(raw, str):
                for kind in ("message.delta", "message.completed"):
                    if kind not in seen and f'"kind":"{kind}"' in raw:
                        seen[kind] = time.perf_counter()
            return await on_frame(link, raw)

        cp._on_frame = timed  # type: ignore[method-assign]
        sent: dict[str, float] = {}
        send_command = cp._send_command

        async def timed_send(link: Any, cmd: dict[str, Any]) -> None:
            sent.setdefault(cmd["command_id"], time.perf_counter())
            await send_command(link, cmd)

        cp._send_command = timed_send  # type: ignore[method-assign]
        boot = tmp / "boot.json"
        if runtime == "acp":
            execution = dict(execution)
            execution["acp"] = _codex_acp(tmp, execution.pop("base_url"))
        boot.write_text(json.dumps(make_payload(tmp, cp.url, runtime=runtime, **execution)))
        boot.chmod(0o600)
        proc = _spawn_driver(boot, tmp / "driver.stderr")
        turns = 0

        async def turn() -> tuple[float, float]:
            nonlocal turns
            turns += 1
            seen.clear()
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id=f"run-{turns}", input={"text": PROMPT})
            status = await cp.wait_for_command_status(cid, timeout=60)
            if status["status"] != "completed" or len(seen) < 2:
                raise RuntimeError(f"turn {turns} ended {status['status']}; see {tmp / 'driver.stderr'}")
            t0 = sent[cid]
            return (seen["message.delta"] - t0) * 1000, (seen["message.completed"] - t0) * 1000

        try:
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=120)
            yield turn
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


def _codex_acp(tmp: Path, base_url: str) -> dict[str, Any]:
    """codex-acp (from node_modules) against the fake, as tests/kernel/runtimes.py runs it."""
    from agent_lab.bench._common import ROOT
    from agent_lab.testing import codex_acp

    binary = codex_acp.binary(ROOT)
    if binary is None:
        raise SystemExit("codex-acp is not installed under node_modules")
    state = tmp / "state"
    (state / "tmp").mkdir(parents=True, exist_ok=True)  # codex-acp will not install its helper under TMPDIR
    home = codex_acp.write_home(state / "codex-acp-home", base_url, "FAKE_OPENAI_API_KEY")
    return {"command": [str(binary)], "env": {"CODEX_HOME": str(home), "TMPDIR": str(state / "tmp")}}


async def _main(runtime: str) -> None:
    from agent_lab.testing.fake_responses import FakeResponses
    from driver import logs

    logs.configure("error")
    results: dict[str, list[tuple[float, float]]] = {"direct": [], "kept": []}
    with tempfile.TemporaryDirectory(prefix="bench-keeper-") as tmp_s, FakeResponses() as fake:
        tmp = Path(tmp_s)
        base: dict[str, Any] = _codex_execution(fake.base_url)
        if runtime == "acp":
            base = {"environment": {"FAKE_OPENAI_API_KEY": "sk-bench-fake"}, "base_url": fake.base_url}
        async with (
            driven(tmp / "direct", dict(base), runtime) as direct,
            driven(tmp / "kept", {**base, "reattach_grace_ms": 30_000}, runtime) as kept,
        ):
            await direct()  # warm-up turns
            await kept()
            order: list[tuple[str, Turn]] = [("direct", direct), ("kept", kept)]
            for _ in range(RUNS):
                for name, turn in order:
                    results[name].append(await turn())
                order.reverse()  # neither side always goes first
    rows = []
    for name, label in (("direct", "provider spawned directly"), ("kept", "provider under the keeper")):
        ttft = [t for t, _ in results[name]]
        done = [c for _, c in results[name]]
        rows.append(
            [label, len(ttft), percentile(ttft, 50), percentile(ttft, 99), percentile(done, 50), percentile(done, 99)]
        )
    who = "codex-acp (ACP)" if runtime == "acp" else "Codex"
    table(
        f"{who} through the driver, with and without the keeper (ms from input.start on the wire)",
        ["provider", "turns", "first token p50", "first token p99", "message.completed p50", "message.completed p99"],
        rows,
    )


def main() -> None:
    runtime = sys.argv[1] if len(sys.argv) > 1 else "openai-app-server"
    if runtime not in ("openai-app-server", "acp"):
        raise SystemExit(f"unknown runtime {runtime!r}: openai-app-server or acp")
    anyio.run(_main, runtime)


if __name__ == "__main__":
    main()
