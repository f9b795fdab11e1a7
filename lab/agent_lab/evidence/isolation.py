"""Claim 4, isolation boundaries hold: identity (uids), credential (the control token absent from every
child's environ and argv, from files under cwd/state_dir, the driver's log and every stored event; an
agent tool reading /proc/<driver>/environ, cmdline, mem and the boot file finds nothing), the driver's
state (PROTOCOL §9: an agent tool reads, queries and edits the journal, forges a process record, reads
the lock and the boot payload's folder: each refused, the journal intact), files (ACP `fs/*` outside
the roots and through a symlink refused) and what the driver does not enforce (listed, and the same
state attacks where no mount namespace is allowed, measured but not judged).
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from agent_lab.evidence import checks
from agent_lab.evidence.report import Case, Claim, judged, not_measured
from agent_lab.evidence.rig import Rig, Sandbox, descendants, proc_info, project_root
from agent_lab.testing import agents

NOT_ENFORCED = [
    "root in the sandbox: a tool running as root reads any process's memory, the driver's included, and can "
    "unmount what hides the driver's state (CAP_SYS_ADMIN in the provider's mount namespace)",
    "a machine without namespaces: the driver's state is then visible to the provider tree (the driver reports "
    "containment.degraded once at start; see the case 'driver state without a mount namespace'); what still "
    "holds is that the ports refuse the driver's files and that journal rows are authenticated",
    "network egress: the driver does not restrict where the provider or its tools connect",
    "same-uid reads: the provider runs as the driver's uid; only what the kernel refuses (e.g. a non-dumpable "
    "driver's /proc/<pid>/mem and environ) protects the driver's memory from its tools",
    "files outside the roots: a provider's own tools (shell, its file edits) are confined only by the provider's "
    "sandbox, not by the driver; the driver's file admission covers what goes through it (ACP fs/*, attachments)",
]
STUBBORN = agents.STUBBORN
MAX_SCAN = 64 * 2**20


def scan_tree(root: Path) -> dict[str, bytes | None]:
    out: dict[str, bytes | None] = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            try:
                out[str(path.relative_to(root.parent))] = path.read_bytes()[:MAX_SCAN]
            except OSError:
                out[str(path.relative_to(root.parent))] = None
    return out


async def credential(rig: Rig, runtime: str, box: Sandbox, driver_pid: int, boot_file: Path) -> list[Case]:
    out_dir = box.cwd / "probe-out"
    probe = f"{shlex.quote(sys.executable)} -m agent_lab.evidence.probe {driver_pid} {boot_file} {out_dir}"
    tool = f"cd {shlex.quote(str(project_root()))} && {probe}; sleep 2"
    await rig.cp.send_command(box.instance, "input.start", run_id="run-probe", input={"text": f"[[shell:{tool}]]"})
    await rig.event(box.instance, lambda e: e["run_id"] == "run-probe" and e["kind"] == "tool.started")
    # While the tool runs: every process under the driver.
    children = [proc_info(p) for p in descendants(driver_pid)]
    term = await rig.terminal(box.instance, "run-probe", timeout=90)
    places: dict[str, bytes | str | None] = {}
    for c in children:
        places[f"environ of {c['pid']} {c['argv0']}"] = c["environ"]
        places[f"argv of {c['pid']} {c['argv0']}"] = c["cmdline"]
    tried = {}
    for name in ("environ", "cmdline", "mem", "boot_file"):
        got = out_dir / f"{name}.bin"
        denied = out_dir / f"{name}.denied"
        tried[name] = denied.read_text() if denied.exists() else ("read" if got.exists() else "did not run")
        places[f"agent tool read of {name}"] = got.read_bytes() if got.exists() else None
    for name, data in scan_tree(box.cwd).items():
        if "probe-out" not in name:
            places[f"file {name}"] = data
    places.update({f"file {k}": v for k, v in scan_tree(box.state_dir).items()})
    for d in rig.drivers:
        places[f"driver log {d.log_path.name}"] = d.log()
    places["stored events"] = json.dumps(rig.cp.events(box.instance))
    places["stored command updates"] = json.dumps(
        [rig.cp.command_updates(c["command_id"]) for c in rig.cp.commands(box.instance)]
    )
    findings = checks.token_findings(places, rig.token)
    probe_findings = {p: v for p, v in findings.items() if p.startswith("agent tool read")}
    passive = {p: v for p, v in findings.items() if p not in probe_findings}
    uid_file = out_dir / "uid.txt"
    probe_uid = int(uid_file.read_text()) if uid_file.exists() else None
    ran = all(v != "did not run" for v in tried.values())
    as_root_mem: dict[str, str] = {}
    if probe_uid == 0:
        # Root (CAP_SYS_PTRACE) reads any process's memory: no driver setting prevents it, so that read
        # is listed as not enforced rather than judged; environ, cmdline and the boot file still are.
        as_root_mem = {p: v for p, v in probe_findings.items() if p == "agent tool read of mem"}
        probe_findings = {p: v for p, v in probe_findings.items() if p not in as_root_mem}
    probe_failures = checks.judge_token(probe_findings) + ([] if ran else ["the probe tool did not run"])
    uids = {
        "driver_uid": proc_info(driver_pid)["uid"],
        "provider_uids": sorted({c["uid"] for c in children if c["uid"] is not None}),
        "processes": [c["argv0"] for c in children],
    }
    return [
        judged("identity", uids, [], "uids read from /proc while a tool ran"),
        judged(
            "credential: children, files, logs, events",
            {
                "children_checked": len(children),
                "places_checked": len(passive),
                "token_found_in": sorted(p for p, v in passive.items() if v == "FOUND"),
            },
            checks.judge_token(passive),
            "environ and argv of every process under the driver while a tool ran; every file under cwd and "
            "state_dir; the driver's log; stored events and command updates",
        ),
        judged(
            "credential: an agent tool reads the driver",
            {
                "tool_uid": probe_uid,
                "tried": tried,
                "token_found_in": sorted(p for p, v in probe_findings.items() if v == "FOUND"),
                "probe_run": checks.run_outcome(term),
            },
            probe_failures,
            "a shell tool (python -m agent_lab.evidence.probe) reads /proc/<driver>/environ, cmdline, mem (readable "
            "regions of maps) and the boot file path; its copies are searched for the token",
        ),
        *(
            [
                not_measured(
                    "credential: a root tool reads the driver's memory",
                    "the tool ran as root, which reads any process's memory (CAP_SYS_PTRACE) whatever the driver "
                    f"does (token {as_root_mem.get('agent tool read of mem', 'not found')} there); the same-uid, "
                    "non-root case is refused (PR_SET_DUMPABLE 0, tests/test_undumpable.py): run the sandbox as "
                    "a non-root user",
                )
            ]
            if probe_uid == 0
            else []
        ),
    ]


DRIVER_STATE = "driver state: an agent tool reads and edits the journal, reads the boot folder"
DRIVER_STATE_NONS = "driver state without a mount namespace"
STATE_ATTACKS_REFUSED = (
    "read the journal",
    "query the journal",
    "edit the journal (sqlite3)",
    "append to the journal",
    "read the process records",
    "forge a process record",
    "read the state_dir lock",
    "read the boot folder's files",
)


async def state_attack(rig: Rig, box: Sandbox, boot_file: Path, run_id: str) -> tuple[dict[str, str], dict[str, Any]]:
    """An agent tool (python -m agent_lab.evidence.state_probe) goes after the driver's own files from
    inside the provider tree. Returns what each attempt got, and what the evidence then finds."""
    out = box.cwd / f"{run_id}-out"
    journal = box.state_dir / "driver" / "journal.sqlite3"
    before = _journal_facts(journal)
    records_before = (box.state_dir / "driver" / "processes.json").read_bytes()
    # By path (standard library only): the provider's Python need not import this checkout's lab.
    script = Path(__file__).with_name("state_probe.py")
    tool = f"{shlex.quote(sys.executable)} -I {script} {box.state_dir} {boot_file.parent} {out}"
    term = await rig.turn(box.instance, run_id, f"[[shell:{tool}]]")
    results_file = out / "results.json"
    results: dict[str, str] = json.loads(results_file.read_text()) if results_file.exists() else {}
    copies = {f"agent tool copy of {p.name}": p.read_bytes() for p in sorted((out / "copies").glob("*"))}
    after = _journal_facts(journal)
    facts = {
        "probe_run": checks.run_outcome(term),
        "token_in_what_it_read": checks.token_findings(copies, rig.token) if copies else {},
        "journal_epoch_before_after": [before.get("epoch"), after.get("epoch")],
        "forged_table_in_journal": after.get("forged", False),
        "process_records_unchanged": (box.state_dir / "driver" / "processes.json").read_bytes() == records_before,
        "degraded_reported": any(
            e["payload"].get("code") == "containment.degraded"
            for e in rig.cp.events(box.instance)
            if e["kind"] == "diagnostic.reported"
        ),
    }
    return results, facts


def _journal_facts(journal: Path) -> dict[str, Any]:
    import sqlite3

    try:
        with sqlite3.connect(f"file:{journal}?mode=ro", uri=True) as db:
            epoch = db.execute("select value from meta where key = 'epoch'").fetchone()
            forged = db.execute("select 1 from sqlite_master where name = 'forged_by_agent'").fetchone()
    except sqlite3.Error as exc:
        return {"error": str(exc)}
    return {"epoch": epoch[0] if epoch else None, "forged": forged is not None}


async def driver_state(rig: Rig, box: Sandbox, boot_file: Path) -> Case:
    results, facts = await state_attack(rig, box, boot_file, "run-state")
    failures = [f"'{name}' was not refused: {results.get(name, 'did not run')}" for name in STATE_ATTACKS_REFUSED
                if not results.get(name, "").startswith("refused")]  # fmt: skip
    listed = json.loads(results.get("list the boot folder", "succeeded: []").removeprefix("succeeded: ") or "[]")
    extra = sorted(set(listed) - {box.cwd.name, box.state_dir.name})
    if extra:
        failures.append(f"the boot folder shows the driver's files: {extra}")
    failures += checks.judge_token(facts["token_in_what_it_read"])
    if (
        facts["journal_epoch_before_after"][0] != facts["journal_epoch_before_after"][1]
        or facts["forged_table_in_journal"]
    ):
        failures.append("the journal was edited")
    if not facts["process_records_unchanged"]:
        failures.append("the process records were rewritten")
    if facts["degraded_reported"]:
        failures.append("the driver reported containment.degraded")
    if not results:
        failures.append("the probe tool did not run")
    return judged(
        DRIVER_STATE,
        {"attacks": results, "boot_folder_as_the_tool_sees_it": listed, **facts},
        failures,
        "a shell tool (agent_lab/evidence/state_probe.py) reads, queries and edits the journal "
        "(sqlite3), forges a process record, reads the lock and every file of the boot payload's folder; "
        "its copies are searched for the token; the journal and records are checked from outside",
    )


async def driver_state_degraded(rig: Rig, runtime: str) -> Case:
    """The same attacks where no mount namespace is allowed (forced: AGENT_DRIVER_CONTAINMENT=subreaper):
    listed, not judged: nothing hides the files then."""
    box = rig.sandbox(f"drv-ev-iso-nons-{runtime}")
    d = rig.start(runtime, box, env={"AGENT_DRIVER_CONTAINMENT": "subreaper"})
    try:
        await rig.started(box.instance)
        results, facts = await state_attack(rig, box, d.boot_file, "run-state-nons")
    finally:
        await d.stop()
    return not_measured(
        DRIVER_STATE_NONS,
        "not enforced where the machine allows no namespace: the driver says so (containment.degraded: "
        f"{'reported' if facts['degraded_reported'] else 'NOT reported'}); journal rows are authenticated and "
        "the ports still refuse the driver's files",
        {"attacks": results, **facts},
        "the same shell tool with AGENT_DRIVER_CONTAINMENT=subreaper (no mount namespace)",
    )


async def files(rig: Rig, base: Path) -> Case:
    """ACP fs/* through the driver's admission: our ACP test agent asks to read outside the roots."""
    instance = "drv-ev-iso-fs"
    box = Sandbox(base / instance, instance).create()
    outside = base / "outside-secret.txt"
    outside.write_text("outside")
    (box.cwd / "escape").symlink_to(outside)
    rig.start("acp", box, acp_command=[sys.executable, str(STUBBORN), "normal"])
    await rig.started(instance)
    results: dict[str, str] = {}
    for run_id, text in (
        ("run-out", f"[[read:{outside}]]"),
        ("run-link", f"[[read:{box.cwd / 'escape'}]]"),
        ("run-write", f"[[write:{base / 'written-outside.txt'}:x]]"),
        ("run-in", f"[[read:{box.cwd / 'inside.txt'}]]"),
    ):
        if run_id == "run-in":
            (box.cwd / "inside.txt").write_text("inside")
        term = await rig.turn(instance, run_id, text)
        results[run_id] = str(term["payload"].get("final_message_text") or "")[:80]
    failures = []
    for run_id in ("run-out", "run-link", "run-write"):
        if "error" not in results[run_id]:
            failures.append(f"{run_id} was not refused: {results[run_id]!r}")
    if (base / "written-outside.txt").exists():
        failures.append("a file was written outside the roots")
    if results["run-in"] != "read: inside":
        failures.append(f"a read inside cwd failed: {results['run-in']!r}")
    measured = {
        "read outside": results["run-out"],
        "read via symlink escape": results["run-link"],
        "write outside": results["run-write"],
        "read inside (control)": results["run-in"],
    }
    return judged(
        "files: ACP fs/* outside the roots",
        measured,
        failures,
        "an ACP agent (agent_lab/testing/agents/stubborn_acp_agent.py) asks fs/read_text_file and fs/write_text_file",
    )


async def model_key_case(rig: Rig, runtime: str) -> Case:
    """PROTOCOL §6.7's row (agent_lab.evidence.model_key): a model key behind the model proxy is
    nowhere an agent tool can read. Kept apart from the control-token rows above."""
    from agent_lab.evidence import model_key

    try:
        return await model_key.model_key(rig, runtime)
    except Exception as exc:
        return Case(model_key.NAME, "failed", {}, f"{type(exc).__name__}: {exc}"[:300])


async def collect(rig: Rig, runtime: str, *, first_runtime: bool = True, **_: Any) -> Claim:
    """`first_runtime`: this is the evidence run's first runtime, whose claim runs issue 30's attacks
    (they aim at the kernel, the same for every runtime: run and listed once, not per runtime)."""
    claim = Claim("isolation", runtime)
    instance = f"drv-ev-iso-{runtime}"
    box = rig.sandbox(instance)
    d = rig.start(runtime, box)
    try:
        await rig.started(instance)
        claim.cases += await credential(rig, runtime, box, d.pid, d.boot_file)
    except Exception as exc:
        claim.cases.append(Case("credential", "failed", {}, f"{type(exc).__name__}: {exc}"[:300]))
    state_cases: list[tuple[str, Callable[[], Awaitable[Case]]]] = [
        (DRIVER_STATE, lambda: driver_state(rig, box, d.boot_file)),
        (DRIVER_STATE_NONS, lambda: driver_state_degraded(rig, runtime)),
    ]
    for name, attack in state_cases:
        try:
            claim.cases.append(await attack())
        except Exception as exc:
            claim.cases.append(Case(name, "failed", {}, f"{type(exc).__name__}: {exc}"[:300]))

    claim.cases.append(await model_key_case(rig, runtime))
    from agent_lab.evidence import attacks  # issue 30: each attack through the real driver, listed

    if first_runtime:
        try:
            claim.cases.append(await attacks.case(rig, runtime))
        except Exception as exc:
            claim.cases.append(Case(attacks.NAME, "failed", {}, f"{type(exc).__name__}: {exc}"[:300]))
    else:
        claim.notes.append(f"{attacks.NAME}: run once per evidence run, listed under the first runtime's claim")
    if runtime == "acp":
        try:
            claim.cases.append(await files(rig, rig.root))
        except Exception as exc:
            claim.cases.append(
                Case("files: ACP fs/* outside the roots", "failed", {}, f"{type(exc).__name__}: {exc}"[:300])
            )
    else:
        claim.cases.append(
            not_measured(
                "files: ACP fs/* outside the roots",
                f"{runtime} has no client file system: its tools touch files themselves",
            )
        )
    claim.cases.append(not_measured("network", "not enforced by the driver (listed below)"))
    claim.notes += NOT_ENFORCED
    claim.notes.append(
        f"the evidence runs in pid namespace {os.readlink('/proc/self/ns/pid')} as uid {os.geteuid()}; each provider "
        "tree runs in a pid and mount namespace of its own (bwrap), where state_dir/driver/, the state_dir lock "
        "and the boot payload's folder are covered (state_dir, cwd and the runtime bound back)"
    )
    return claim
