"""PROTOCOL §9 through the real driver process and every REAL runtime: a shell tool the fake model asks
the provider to run tries to read and edit the journal, read the lock and the boot payload's folder,
and grep them for the control token. Everything of the driver's is hidden (an empty, read-only tmpfs
in the provider's mount namespace); the provider's own home under `state_dir` and `cwd` stay visible.
Where no mount namespace is allowed, `containment.degraded` says so once.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.helpers import reach
from tests.integration.harness import INSTANCE, ROOT, TOKEN, control_plane
from tests.kernel import runtimes
from tests.kernel.runtimes import RUNTIMES, Fakes
from tests.kernel.support import Driver, wait_terminal

pytestmark = pytest.mark.provider


def attack(tmp: Path) -> str:
    """A shell script writing what it could do into cwd/probe.txt (no `]]`: it sits in a [[shell:]])."""
    state, out = tmp / "state", tmp / "cwd" / "probe.txt"
    targets = [
        state / "driver" / "journal.sqlite3",
        state / "driver" / "processes.json",
        state / "driver.lock",
        tmp / "next.boot.json",  # the boot folder: e.g. the payload of the next driver process
        tmp / "cp.sqlite3",
    ]
    lines = [f": > {out}"]
    for t in targets:
        lines.append(
            f"if test -s {t} && cat {t} > /dev/null 2>&1; then echo read {t}; else echo hidden {t}; fi >> {out}"
        )
    lines.append(f"echo forged >> {state / 'driver' / 'journal.sqlite3'} 2>/dev/null && echo wrote journal >> {out}")
    lines.append(f"ls {state / 'providers'} > /dev/null && echo providers visible >> {out}")
    # The token's text split in two, so the command line itself (kept in the provider's own
    # transcript, which is visible) never matches.
    head, tail = TOKEN[:6], TOKEN[6:]
    lines.append(f"env > {tmp / 'cwd' / 'env.txt'}")
    lines.append(f"grep -rl {head}'{tail}' {tmp} >> {out} 2>/dev/null; echo end >> {out}")
    return "; ".join(lines)


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_an_agent_tool_cannot_read_or_edit_the_driver_state(runtime: str, tmp_path: Path, fakes: Fakes) -> None:
    (tmp_path / "next.boot.json").write_text(f'{{"control": {{"token": "{TOKEN}"}}}}')
    async with control_plane(tmp_path) as cp:
        payload = runtimes.payload(runtime, tmp_path, cp.url, fakes)
        payload["execution"]["permission_policy"] = "full_access"
        d = Driver(tmp_path, payload, env={"DRIVER_ONLY_SECRET": "driver-env-value-31337"})
        try:
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=90)
            text = f"[[shell:{attack(tmp_path)}]]"
            await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": text})
            term = await wait_terminal(cp, "run-1", timeout=90)
            assert term["kind"] == "run.completed", term
            lines = (tmp_path / "cwd" / "probe.txt").read_text().splitlines()
            assert lines[-1] == "end", lines  # the tool ran to its end
            read = [line for line in lines if line.startswith("read ")]
            assert read == [], lines
            assert len([line for line in lines if line.startswith("hidden ")]) == 5
            assert "wrote journal" not in lines
            assert "providers visible" in lines
            # grep found no file holding the token (only "end" follows the checks).
            assert lines[lines.index("providers visible") + 1 :] == ["end"], lines
            # Outside the namespace the journal is the driver's, intact, and the driver goes on.
            journal = tmp_path / "state" / "driver" / "journal.sqlite3"
            assert b"forged" not in journal.read_bytes()
            sqlite3.connect(f"file:{journal}?mode=ro", uri=True).execute("select 1").close()
            # The tool has the provider's environment only: nothing of the driver's own, nor the
            # Claude launcher's variable.
            tool_env = (tmp_path / "cwd" / "env.txt").read_text()
            assert "driver-env-value-31337" not in tool_env and "AGENT_DRIVER" not in tool_env
            kinds = [e["payload"]["code"] for e in cp.events(INSTANCE, kinds="diagnostic.reported")]
            assert "containment.degraded" not in kinds
        finally:
            d.close()


async def test_without_a_mount_namespace_the_driver_says_so_once(tmp_path: Path, fakes: Fakes) -> None:
    async with control_plane(tmp_path) as cp:
        payload = runtimes.payload("acp:stubborn", tmp_path, cp.url, fakes)
        d = Driver(tmp_path, payload, env={"AGENT_DRIVER_CONTAINMENT": "subreaper"})
        try:
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=60)
            found = [
                e["payload"]
                for e in cp.events(INSTANCE, kinds="diagnostic.reported")
                if e["payload"]["code"] == "containment.degraded"
            ]
            assert len(found) == 1, found
            assert found[0]["details"]["mode"] == "subreaper"
            visible = {v["path"] for v in found[0]["details"]["visible"]}
            assert str((tmp_path / "state" / "driver").resolve()) in visible
            assert TOKEN not in repr(found)
        finally:
            d.close()


def spawn_as(uid: int, boot: Path, env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    """The driver as `uid`, with the checkout and the interpreter reachable even when a folder above
    them is closed to that uid (a clone under a 0700 folder)."""
    with log_path.open("wb") as log:
        return subprocess.Popen(
            [*reach.as_uid(uid, uid, reach.interpreter_paths()),
             sys.executable, "-m", "driver.cli", "run", "--boot-file", str(boot)],
            stdout=subprocess.DEVNULL, stderr=log, env=env, cwd=ROOT, start_new_session=True,
        )  # fmt: skip


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to an unprivileged uid needs root")
@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_as_an_unprivileged_uid_the_driver_state_is_hidden_too(runtime: str, fakes: Fakes) -> None:
    """The driver as uid 10001 (bwrap then makes a user namespace for the mounts): the same attack fails."""
    uid = 10001
    tmp = Path(tempfile.mkdtemp(prefix="hidden-uid-", dir="/tmp"))
    try:
        (tmp / "next.boot.json").write_text(f'{{"control": {{"token": "{TOKEN}"}}}}')
        async with control_plane(tmp) as cp:
            payload = runtimes.payload(runtime, tmp, cp.url, fakes)
            payload["execution"]["permission_policy"] = "full_access"
            boot = tmp / "driver.boot.json"
            boot.write_text(json.dumps(payload))
            for path in [tmp, *tmp.rglob("*")]:
                os.chown(path, uid, uid)
            boot.chmod(0o600)
            env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_DRIVER")}
            env["AGENT_DRIVER_PROJECT_ROOT"] = str(ROOT)
            proc = spawn_as(uid, boot, env, tmp / "driver.stderr.log")
            try:
                await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=90)
                text = f"[[shell:{attack(tmp)}]]"
                await cp.send_command(INSTANCE, "input.start", run_id="run-u", input={"text": text})
                term = await wait_terminal(cp, "run-u", timeout=90)
                assert term["kind"] == "run.completed", (term, (tmp / "driver.stderr.log").read_text()[-2000:])
                lines = (tmp / "cwd" / "probe.txt").read_text().splitlines()
                assert lines[-1] == "end" and [x for x in lines if x.startswith("read ")] == [], lines
                assert "wrote journal" not in lines and "providers visible" in lines
                assert lines[lines.index("providers visible") + 1 :] == ["end"], lines
                codes = [e["payload"]["code"] for e in cp.events(INSTANCE, kinds="diagnostic.reported")]
                assert "containment.degraded" not in codes
            finally:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
