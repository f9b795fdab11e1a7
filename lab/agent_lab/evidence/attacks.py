"""The attacks of issue 30 ("the agent is not trusted, second pass"), each through the real driver, for
the isolation claim (agent_lab.evidence.isolation).

ONE list, `ATTACKS`: each entry is a name and an async function that gets a fresh driver (`Target`, our
stubborn ACP agent: a real provider process, model-free; the attacks aim at the kernel, the same for every
runtime) and returns an `Outcome` (passed or not, with a one-line detail). To add an attack, write such a
function and append it to `ATTACKS`; `case` runs them all and lists each with its result.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from agent_lab.evidence.report import Case
from agent_lab.evidence.rig import DriverProc, Rig, Sandbox, payload
from agent_lab.testing import agents

NAME = "issue 30 attacks through the real driver"


class Outcome(NamedTuple):
    passed: bool
    detail: str


@dataclass
class Target:
    """A started driver of its own sandbox, and the rig's control plane."""

    rig: Rig
    box: Sandbox
    driver: DriverProc

    @property
    def instance(self) -> str:
        return self.box.instance

    async def raw(self, frame: dict[str, Any]) -> None:
        await self.rig.cp.send_raw(self.instance, json.dumps(frame))

    def final(self, command_id: str) -> dict[str, Any] | None:
        """The terminal command.update the driver sent (raw frames are not in the CP's store)."""
        done = [u for u in self.rig.cp.command_updates(command_id) if u["status"] != "accepted"]
        return done[-1] if done else None

    async def finals(self, command_ids: list[str], at_least: int, timeout: float = 30.0) -> list[dict[str, Any]]:
        await self.rig.cp.wait_until(lambda: sum(self.final(c) is not None for c in command_ids) >= at_least, timeout)
        return [f for c in command_ids if (f := self.final(c)) is not None]

    async def slow_run(self, run_id: str) -> str:
        cid, _ = await self.rig.cp.send_command(self.instance, "input.start", run_id=run_id, input={"text": "[[slow]]"})
        await self.rig.event(self.instance, lambda e: e["kind"] == "message.delta" and e["run_id"] == run_id, 30)
        return cid

    async def status(self, kind: str, timeout: float = 30.0, **fields: Any) -> dict[str, Any]:
        cid, _ = await self.rig.cp.send_command(self.instance, kind, **fields)
        return dict(await self.rig.cp.wait_for_command_status(cid, timeout=timeout))


def _frame(command_id: str, seq: int, kind: str, **fields: Any) -> dict[str, Any]:
    return {"type": "command", "command_id": command_id, "seq": seq, "kind": kind, **fields}


def _code(status: dict[str, Any] | None) -> str | None:
    return ((status or {}).get("error") or {}).get("code")


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


def _secret_by_value(boot: dict[str, Any]) -> None:
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


Attack = tuple[str, Callable[[Target], Awaitable[Outcome]], Callable[[dict[str, Any]], None] | None]
# name, attack, how its boot payload differs from the plain stubborn one (None: not at all).
ATTACKS: list[Attack] = [
    ("24 queued input.starts in a burst", queue_burst, None),
    ("a reused run_id", reused_run_id, None),
    ("a command seq outside int64", seq_out_of_range, None),
    ("a secret by value in process.start", secret_by_value, _secret_by_value),
]


def _targets(rig: Rig, runtime: str) -> Iterator[tuple[str, Sandbox, dict[str, Any]]]:
    for i, (name, _, mutate) in enumerate(ATTACKS):
        box = rig.sandbox(f"drv-ev-attack-{runtime}-{i}")
        boot = payload(
            "acp", box, rig.cp.url, rig.token, rig.fakes, acp_command=[sys.executable, str(agents.STUBBORN), "normal"]
        )
        if mutate is not None:
            mutate(boot)
        yield name, box, boot


async def case(rig: Rig, runtime: str) -> Case:
    """Every attack of `ATTACKS`, each on a fresh driver; passed when every one did."""
    results: dict[str, dict[str, str]] = {}
    for (name, attack, _), (_, box, boot) in zip(ATTACKS, _targets(rig, runtime), strict=True):
        driver = DriverProc(box, boot)
        rig.drivers.append(driver)
        try:
            await rig.started(box.instance)
            outcome = await attack(Target(rig, box, driver))
        except Exception as exc:
            outcome = Outcome(False, f"{type(exc).__name__}: {exc}"[:300])
        finally:
            await driver.stop()
        results[name] = {"result": "passed" if outcome.passed else "failed", "detail": outcome.detail}
    failed = [n for n, r in results.items() if r["result"] != "passed"]
    return Case(
        NAME,
        "failed" if failed else "passed",
        {"attacks": results},
        f"failed: {', '.join(failed)}" if failed else None,
        "each attack of agent_lab/evidence/attacks.py on a fresh driver (stubborn ACP agent) through the lab CP",
    )
