"""The attacks of issue 30 ("the agent is not trusted, second pass"), each through the real driver, for
the isolation claim (agent_lab.evidence.isolation).

ONE list, `ATTACKS`: each entry names what the agent tries and gives an async function that gets a fresh
driver (`Target`: our stubborn ACP agent unless the entry names a runtime, a real provider process,
model-free; the attacks aim at the kernel, the same for every runtime) and returns an `Outcome` (passed
or not, with the measured fact). To add an attack, write such a function and append it to `ATTACKS`;
`case` runs them all, once per evidence run, and lists each with its result. The attacks on the driver's
state live in attacks_state, those on the model proxy and the listeners in attacks_proxy.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

from agent_lab.evidence import attacks_proxy as proxy
from agent_lab.evidence import attacks_state as state
from agent_lab.evidence.attack_kit import Outcome, Target
from agent_lab.evidence.attack_kit import code as _code
from agent_lab.evidence.attack_kit import frame as _frame
from agent_lab.evidence.report import Case
from agent_lab.evidence.rig import DriverProc, Rig, Sandbox, payload
from agent_lab.testing import agents

NAME = "issue 30 attacks through the real driver"


async def queue_burst(t: Target) -> Outcome:
    """24 queued input.starts in one burst while a run is active: 16 held, 8 refused."""
    await t.slow_run("run-0")
    ids = [f"cmd-burst-{i}" for i in range(24)]
    for i, cid in enumerate(ids):
        await t.raw(_frame(cid, 10_000 + i, "input.start", run_id=f"q-{i}", input={"text": "hi"}, queue=True))
    refused = await t.finals(ids, 8)
    beat = await t.rig.cp.wait_for(t.instance, lambda i: i["type"] == "heartbeat" and "queued" in i, timeout=10)
    held = len(beat.get("queued") or [])
    codes = sorted({str(_code(s)) for s in refused})
    ok = held == 16 and len(refused) == 8 and codes == ["driver.queue_full"]
    return Outcome(ok, f"held {held}, refused {len(refused)} ({', '.join(codes)})")


async def reused_run_id(t: Target) -> Outcome:
    """A run id used again after its run ended, and while it runs: run.duplicate, one terminal."""
    first = await t.status("input.start", run_id="run-1", input={"text": "[[say:one]]"})
    await t.slow_run("run-2")
    after = await t.status("input.start", run_id="run-1", input={"text": "again"})
    during = await t.status("input.start", run_id="run-2", input={"text": "again"}, queue=True)
    terminals = [
        e
        for e in t.rig.cp.events(t.instance)
        if e["run_id"] == "run-1" and e["kind"] in ("run.completed", "run.failed", "run.cancelled")
    ]
    ok = first["status"] == "completed" and _code(after) == _code(during) == "run.duplicate" and len(terminals) == 1
    return Outcome(
        ok, f"after its end: {_code(after)}; while running: {_code(during)}; run-1 terminals: {len(terminals)}"
    )


async def seq_out_of_range(t: Target) -> Outcome:
    """Commands whose seq is outside int64 but whose command_id is readable: each answered command.invalid."""
    seqs = {f"cmd-seq-{i}": s for i, s in enumerate((2**63, 2**64, 10**30, -(2**70)))}
    for cid, seq in seqs.items():
        await t.raw(_frame(cid, seq, "turn.cancel", run_id="r"))
    answered = await t.finals(list(seqs), len(seqs), timeout=15)
    codes = [_code(s) for s in answered]
    alive = await t.status("input.start", run_id="run-after", input={"text": "[[say:ok]]"})
    ok = codes == ["command.invalid"] * 4 and alive["status"] == "completed"
    return Outcome(ok, f"answered {len(answered)}/4 ({sorted(set(map(str, codes)))}); next run {alive['status']}")


SECRET = "sk-evidence-withheld-5e1f0c"


def _secret_by_value(boot: dict[str, Any], rig: Rig, box: Sandbox) -> None:
    execution = boot["execution"]
    execution["environment"] = {"ANTHROPIC_API_KEY": SECRET, "SECOND_NAME": SECRET, "HARMLESS": "visible-1"}
    execution["model_proxy"] = {"secrets": ["ANTHROPIC_API_KEY"]}


async def secret_by_value(t: Target) -> Outcome:
    """The §6.7 secret under a second name of the payload and of process.start{env}, and the token: a
    process that prints its environment sees none of them."""
    env = {"ALIAS": SECRET, "TOKEN_ALIAS": t.rig.token}
    started = await t.status("process.start", process_id="env", argv=["env", "-0"], env=env)
    await t.rig.event(t.instance, lambda e: e["kind"] == "process.exited" and e["payload"]["process_id"] == "env")
    chunks = sorted(
        (e["payload"]["offset"], e["payload"]["data"])
        for e in t.rig.cp.events(t.instance, "process.output")
        if e["payload"]["process_id"] == "env"
    )
    text = "".join(data for _, data in chunks)
    seen = dict(entry.split("=", 1) for entry in text.split("\0") if "=" in entry)
    leaked = sorted(k for k, v in seen.items() if SECRET in v or t.rig.token in v)
    ok = started["status"] == "completed" and seen.get("HARMLESS") == "visible-1" and not leaked
    return Outcome(ok, f"process saw {len(seen)} variables; holding the secret or token: {leaked or 'none'}")


Setup = Callable[[dict[str, Any], Rig, Sandbox], None]


class Attack(NamedTuple):
    name: str  # what the agent tries
    run: Callable[[Target], Awaitable[Outcome]]
    setup: Setup | None = None  # how its boot payload differs from the plain one (None: not at all)
    env: dict[str, str] | None = None  # the driver's environment (e.g. no mount namespace)
    runtime: str = "stubborn"  # or a real runtime of the rig's payload ("claude-agent-sdk")


ATTACKS: list[Attack] = [
    Attack("24 queued input.starts in a burst", queue_burst),
    Attack("a reused run_id", reused_run_id),
    Attack("a command seq outside int64", seq_out_of_range),
    Attack("a secret by value in process.start", secret_by_value, _secret_by_value),
    Attack("its $HOME replaced by a file, then its provider killed", state.home_replaced_by_a_file, env=state.FAST),
    Attack(
        "links planted at the proxied CODEX_HOME's config.toml, then its provider killed",
        proxy.planted_link_at_proxied_config,
        proxy._proxied_codex,
        state.FAST,
    ),
    Attack(
        "its own base_url in its CODEX_HOME/config.toml, then a driver restart",
        proxy.agent_base_url,
        proxy._proxied_codex,
    ),
    Attack(
        "the model proxy as a relay (non-model paths, #fragment) and a burst of 8 under a token budget",
        proxy.relay_and_burst,
        proxy._anthropic(budget={"max_tokens_per_run": proxy.BUDGET}),
    ),
    Attack(
        "keyless 30 MiB floods and idle sockets on the model proxy and the host MCP server",
        proxy.floods_and_idle_sockets,
        proxy._anthropic(host_tools=True),
    ),
    Attack(
        "six sparse 64 MiB files in its native session folder",
        state.sparse_giants,
        runtime="claude-agent-sdk",
    ),
    Attack("a process ring rewritten without a mount namespace", state.ring_rewritten, env=state.DEGRADED),
    Attack(
        "a forged pid in the state_dir lock, then --handover (no mount namespace)",
        state.forged_lock_handover,
        env=state.DEGRADED,
    ),
    Attack(
        "its kept provider under a successor with another boot payload", state.keeper_other_payload, state._reattach
    ),
]


def _boot(rig: Rig, attack: Attack, box: Sandbox) -> dict[str, Any]:
    if attack.runtime == "stubborn":
        command = [sys.executable, str(agents.STUBBORN), "normal"]
        boot = payload("acp", box, rig.cp.url, rig.token, rig.fakes, acp_command=command)
    else:
        boot = payload(attack.runtime, box, rig.cp.url, rig.token, rig.fakes)
    if attack.setup is not None:
        attack.setup(boot, rig, box)
    return boot


async def _one(rig: Rig, runtime: str, i: int, attack: Attack) -> Outcome:
    box = rig.sandbox(f"drv-ev-attack-{runtime}-{i}")
    try:
        boot = _boot(rig, attack, box)
        driver = DriverProc(box, boot, env=attack.env)
        rig.drivers.append(driver)
    except Exception as exc:
        return Outcome(False, f"{type(exc).__name__}: {exc}"[:300])
    try:
        await rig.started(box.instance)
        return await attack.run(Target(rig, box, driver, boot))
    except Exception as exc:
        return Outcome(False, f"{type(exc).__name__}: {exc}"[:300])
    finally:
        # The attack's own successors too (they are in rig.drivers after `driver`).
        for d in rig.drivers[rig.drivers.index(driver) :]:
            await d.stop()


async def case(rig: Rig, runtime: str) -> Case:
    """Every attack of `ATTACKS`, each on a fresh driver; passed when every one did."""
    results: dict[str, dict[str, str]] = {}
    for i, attack in enumerate(ATTACKS):
        t0 = time.monotonic()
        outcome = await _one(rig, runtime, i, attack)
        results[attack.name] = {
            "result": "passed" if outcome.passed else "failed",
            "detail": outcome.detail,
            "seconds": f"{time.monotonic() - t0:.1f}",
        }
    failed = [n for n, r in results.items() if r["result"] != "passed"]
    return Case(
        NAME,
        "failed" if failed else "passed",
        {"attacks": results},
        f"failed: {', '.join(failed)}" if failed else None,
        "each attack of agent_lab/evidence/attacks.py on a fresh driver through the lab CP, from inside the "
        "provider tree (the stubborn ACP agent's tools; the Claude Code CLI's for the native session), once "
        "per evidence run",
    )
