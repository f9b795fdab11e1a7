"""The isolation claim's model-key row (PROTOCOL §6.7): with `execution.model_proxy`, an agent tool
dumps its environment, every process environ it can read and every readable file of the sandbox
(cwd, state_dir, its home), and the real model key is in none of them, while the fake model endpoint
did receive it (so the key was in use, through the proxy)."""

from __future__ import annotations

import json
import secrets
import shlex
import sys
from pathlib import Path

from agent_lab.evidence.checks import run_outcome, token_findings
from agent_lab.evidence.report import Case, judged
from agent_lab.evidence.rig import DriverProc, Rig, payload, project_root

KEY_VAR = {"claude-agent-sdk": "ANTHROPIC_API_KEY", "openai-app-server": "OPENAI_API_KEY", "acp": "FAKE_OPENAI_API_KEY"}
NAME = "credential: the model key, read by an agent tool"


async def model_key(rig: Rig, runtime: str) -> Case:
    instance = f"drv-ev-key-{runtime}"
    box = rig.sandbox(instance)
    key = "sk-evidence-model-key-" + secrets.token_hex(12)
    boot = payload(runtime, box, rig.cp.url, rig.token, rig.fakes)
    execution = boot["execution"]
    var = KEY_VAR[runtime]
    execution["environment"][var] = key
    execution["model_proxy"] = {"secrets": [var]}
    if runtime == "acp":
        # The proxy's /openai route goes where the payload says (docs/protocol.md §6.7), never where the
        # agent's own CODEX_HOME config says: the fake Responses endpoint is named here.
        execution["environment"]["OPENAI_BASE_URL"] = rig.fakes.responses.base_url
    rig.drivers.append(DriverProc(box, boot))
    await rig.started(instance)
    out = box.cwd / "key-probe-out"
    roots = " ".join(shlex.quote(str(p)) for p in (box.cwd, box.state_dir))
    # The probe by path, not by module name: the agent's tool sees no PYTHONPATH, and an installed lab
    # may be another checkout's.
    script = Path(__file__).with_name("key_probe.py")
    probe = f"{shlex.quote(sys.executable)} {shlex.quote(str(script))} {shlex.quote(str(out))} {roots}"
    tool = f"cd {shlex.quote(str(project_root()))} && {probe}"
    term = await rig.turn(instance, "run-key", f"[[shell:{tool}]]")
    places: dict[str, bytes | str | None] = {}
    for name in ("env", "proc_environ", "files"):
        path = out / f"{name}.bin"
        places[f"agent tool dump of {name}"] = path.read_bytes() if path.exists() else None
    summary_file = out / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.exists() else {}
    findings = token_findings(places, key)
    fake = rig.fakes.anthropic if runtime == "claude-agent-sdk" else rig.fakes.responses
    arrived = any(key in json.dumps(h) for h in fake.request_headers)
    failures = [f"the model key was found in {p}" for p, v in sorted(findings.items()) if v == "FOUND"]
    failures += [f"the probe could not write {p}" for p, v in sorted(findings.items()) if v == "unreadable"]
    if not summary:
        failures.append("the probe tool did not run")
    if not arrived:
        failures.append("the fake model endpoint never received the key: the proxy path was not exercised")
    measured = {
        "found_in": sorted(p for p, v in findings.items() if v == "FOUND"),
        "probe": summary,
        "key_arrived_at_fake_upstream": arrived,
        "probe_run": run_outcome(term),
    }
    return judged(
        NAME,
        measured,
        failures,
        "execution.model_proxy withholds the key; a shell tool (python -m agent_lab.evidence.key_probe) dumps its "
        "environment, every /proc/<pid>/environ it can read and every readable file under cwd, state_dir and "
        "$HOME; the dumps are searched for the key",
    )
