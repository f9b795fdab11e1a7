"""Claim 4, isolation boundaries hold: identity (uids), credential (the control token absent from every
child's environ and argv, from files under cwd/state_dir, the driver's log and every stored event; an
agent tool reading /proc/<driver>/environ, cmdline, mem and the boot file finds nothing), files (ACP
`fs/*` outside the roots and through a symlink refused) and what the driver does not enforce.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from agent_lab.evidence import checks
from agent_lab.evidence.report import Case, Claim, judged, not_measured
from agent_lab.evidence.rig import Rig, Sandbox, descendants, proc_info, project_root

NOT_ENFORCED = [
    "root in the sandbox: a tool running as root reads any process's memory, the driver's included",
    "network egress: the driver does not restrict where the provider or its tools connect",
    "same-uid reads: the provider runs as the driver's uid; only what the kernel refuses (e.g. a non-dumpable "
    "driver's /proc/<pid>/mem and environ) protects the driver's memory from its tools",
    "files outside the roots: a provider's own tools (shell, its file edits) are confined only by the provider's "
    "sandbox, not by the driver; the driver's file admission covers what goes through it (ACP fs/*, attachments)",
]
STUBBORN = project_root() / "tests" / "helpers" / "stubborn_acp_agent.py"
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
        "an ACP agent (tests/helpers/stubborn_acp_agent.py) asks fs/read_text_file and fs/write_text_file",
    )


async def model_key_case(rig: Rig, runtime: str) -> Case:
    """PROTOCOL §6.7's row (agent_lab.evidence.model_key): a model key behind the model proxy is
    nowhere an agent tool can read. Kept apart from the control-token rows above."""
    from agent_lab.evidence import model_key

    try:
        return await model_key.model_key(rig, runtime)
    except Exception as exc:
        return Case(model_key.NAME, "failed", {}, f"{type(exc).__name__}: {exc}"[:300])


async def collect(rig: Rig, runtime: str, **_: Any) -> Claim:
    claim = Claim("isolation", runtime)
    instance = f"drv-ev-iso-{runtime}"
    box = rig.sandbox(instance)
    d = rig.start(runtime, box)
    try:
        await rig.started(instance)
        claim.cases += await credential(rig, runtime, box, d.pid, d.boot_file)
    except Exception as exc:
        claim.cases.append(Case("credential", "failed", {}, f"{type(exc).__name__}: {exc}"[:300]))
    claim.cases.append(await model_key_case(rig, runtime))
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
    claim.notes.append(f"pid namespace: {os.readlink('/proc/self/ns/pid')}; the driver runs no namespace of its own")
    return claim
