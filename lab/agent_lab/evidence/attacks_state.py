"""Issue 30's attacks on what the driver keeps under state_dir, each through the real driver from inside
the provider tree (the attacks of tests/kernel/test_bricking.py, test_degraded.py, test_checkpoints.py and
the keeper's fingerprint test): the agent's home replaced by a file, a rewritten process ring, a forged
lock under --handover, a kept provider under another boot payload, sparse giants in the native session.
"""

from __future__ import annotations

import copy
import subprocess
from typing import Any

from agent_lab.evidence.attack_kit import Outcome, Target, exit_code, mib, peak_rss
from agent_lab.evidence.rig import Rig, Sandbox, descendants, wait_gone

# The provider's replacement within a second, not the default backoff's several.
FAST = {"AGENT_DRIVER_RESTART_BACKOFF_MS": "20", "AGENT_DRIVER_RESTART_BACKOFF_CAP_MS": "100"}
# No mount namespace: the driver's own files are visible to the provider tree (containment.degraded).
DEGRADED = {"AGENT_DRIVER_CONTAINMENT": "subreaper"}


async def home_replaced_by_a_file(t: Target) -> Outcome:
    """The agent's $HOME becomes a file, then it kills its provider: the driver stays up, sets the file
    aside, restarts the provider; a later driver on the same state_dir starts (issue 30: exit 70 before)."""
    home = t.box.state_dir / "providers" / "acp" / "home"
    script = 'rm -rf "$HOME" && printf planted > "$HOME" && kill -9 $PPID'
    await t.run("run-brick", f"[[own-shell:{script}]]")
    aside = await t.diagnostic("provider.home_set_aside")
    await t.diagnostic("provider.restarted", after_seq=aside["seq"])
    up = t.driver.proc.poll() is None
    after = await t.run("run-brick-2", "[[say:still here]]")
    kept = sorted(home.parent.glob("home.set-aside-*"))
    kept_ok = len(kept) == 1 and kept[0].read_text() == "planted" and home.is_dir()
    await t.driver.stop()
    again = t.successor("driver-2", env=FAST)
    await t.restarted()
    second = await t.run("run-brick-3", "[[say:second start]]")
    ok = up and after == "completed" and kept_ok and again.proc.poll() is None and second == "completed"
    return Outcome(
        ok,
        f"driver up: {up}; the file kept as {kept[0].name if kept else 'nothing'}; next run {after}; "
        f"a second start on the state_dir: run {second}",
    )


async def ring_rewritten(t: Target) -> Outcome:
    """Without a mount namespace the agent overwrites a process's output ring: process.replay sends none
    of its bytes (process.ring_tampered) and journal.tampered names the table."""
    rings = t.box.state_dir / "driver" / "processes"
    st = await t.status("process.start", process_id="p1", argv=["sh", "-c", "echo ORIGINAL-LINE"])
    await t.rig.event(t.instance, lambda e: e["kind"] == "process.exited", 20)
    forged = "FORGED-BY-AGENT"
    seen = t.box.cwd / "rings-seen.txt"
    script = (
        f"for f in {rings}/*.ring; do printf {forged} | dd of=$f bs=1 seek=0 conv=notrunc 2>/dev/null; done; "
        f"ls {rings} > {seen}"
    )
    await t.run("run-ring", f"[[shell:{script}]]")
    reached = seen.exists() and ".ring" in seen.read_text()
    replay = await t.status("process.replay", process_id="p1", from_offset=0)
    sent = [e["payload"]["data"] for e in t.rig.cp.events(t.instance, "process.output")]
    leaked = any(forged in s for s in sent)
    diag = await t.diagnostic("journal.tampered")
    error = (replay.get("error") or {}).get("code")
    ok = st["status"] == "completed" and reached and error == "process.ring_tampered" and not leaked
    ok = ok and diag["payload"]["details"].get("table") == "process_rings"
    return Outcome(
        ok,
        f"the tool reached the ring: {reached}; replay {replay['status']} ({error}); forged bytes sent: {leaked}; "
        f"journal.tampered on {diag['payload']['details'].get('table')}",
    )


async def forged_lock_handover(t: Target) -> Outcome:
    """Without a mount namespace the agent writes another process's pid into state_dir/driver.lock:
    `--handover` signals no process the lock names without the driver's MAC (exit 75)."""
    victim = subprocess.Popen(["sleep", "300"])  # noqa: ASYNC220 (a victim process; starting it does not block)
    try:
        lock = t.box.state_dir / "driver.lock"
        await t.run("run-lock", f"[[shell:echo {victim.pid} > {lock}]]")
        written = lock.read_text().split() == [str(victim.pid)]
        successor = t.successor("successor", env=DEGRADED, args=("--handover",))
        status = await exit_code(successor, 20)
        refused = "names no driver process that can be verified" in successor.log()
        victim_alive = victim.poll() is None
        driver_alive = t.driver.proc.poll() is None
        after = await t.status("process.start", process_id="p", argv=["true"])
    finally:
        victim.kill()
        victim.wait()
    ok = written and status == 75 and refused and victim_alive and driver_alive and after["status"] == "completed"
    return Outcome(
        ok,
        f"lock forged: {written}; successor exit {status}; victim alive: {victim_alive}; driver alive: "
        f"{driver_alive}; next process.start {after['status']}",
    )


def _reattach(boot: dict[str, Any], rig: Rig, box: Sandbox) -> None:
    boot["execution"]["reattach_grace_ms"] = 30_000


async def keeper_other_payload(t: Target) -> Outcome:
    """The driver dies with its provider kept (reattach_grace_ms); its successor's payload configures the
    provider otherwise (policy full_access -> supervised): the kept tree is ended, not adopted."""
    await t.slow_run("run-kept")
    kept_tree = descendants(t.driver.pid)
    t.driver.kill_driver_only()
    other = copy.deepcopy(t.boot)
    other["execution"]["permission_policy"] = "supervised"
    successor = t.successor("driver-2", boot=other)
    await t.restarted()
    term = await t.rig.terminal(t.instance, "run-kept", 60)
    left = await wait_gone(kept_tree, 15)
    refused = "keeper.not_adopted" in successor.log()
    after = await t.run("run-after", "[[say:ok]]")
    error = (term["payload"].get("error") or {}).get("code")
    ok = bool(kept_tree) and not left and refused and term["kind"] == "run.failed" and after == "completed"
    return Outcome(
        ok,
        f"kept processes {len(kept_tree)}, alive after the successor: {len(left)}; keeper.not_adopted logged: "
        f"{refused}; the kept run {term['kind']} ({error}); next run {after}",
    )


async def sparse_giants(t: Target) -> Outcome:
    """The agent's shell makes six sparse 64 MiB files (no disk) in its own native session's folder (the
    Claude Code CLI's): the next checkpoint refuses them (checkpoint.too_large) before reading a byte."""
    home = t.box.state_dir / "providers" / "claude-agent-sdk" / "claude-config"
    made_file = t.box.cwd / "giants.txt"
    script = (
        f'for f in {home}/projects/*/*.jsonl; do s="${{f%.jsonl}}/tool-results"; mkdir -p "$s"; '
        f'for i in 1 2 3 4 5 6; do truncate -s 64M "$s/giant$i.txt"; done; done; '
        f"ls {home}/projects/*/*/tool-results > {made_file}"
    )
    before = peak_rss(t.driver.pid)
    first = await t.run("run-giants", f"[[shell:{script}]]", timeout=90)
    made = made_file.read_text().split() if made_file.exists() else []
    diag = await t.rig.event(
        t.instance,
        lambda e: e["kind"] == "diagnostic.reported" and e["payload"]["code"].startswith("checkpoint."),
        60,
    )
    grown = peak_rss(t.driver.pid) - before
    recorded = t.rig.cp.events(t.instance, "checkpoint.recorded")
    after = await t.run("run-giants-2", "[[say:ok]]", timeout=90)
    measured = int(diag["payload"]["details"].get("bytes") or 0)
    ok = first == "completed" and len(made) == 6 and diag["payload"]["code"] == "checkpoint.too_large"
    ok = ok and measured >= 6 * 64 * 2**20 and not recorded and grown < 32 * 2**20 and after == "completed"
    return Outcome(
        ok,
        f"{len(made)} giants made; {diag['payload']['code']} ({measured / 2**20:.0f} MiB measured); "
        f"peak RSS {mib(grown)} < 32 MiB; checkpoints recorded {len(recorded)}; next run {after}",
    )
