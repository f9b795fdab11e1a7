"""The mount plan that hides the driver's state from the provider tree (driver/containment/hiding.py), and bwrap
applying it, as root and as an unprivileged uid (PROTOCOL §9)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from driver.containment import hiding


def layout(tmp_path: Path) -> dict[str, Path]:
    boot = tmp_path / "box"
    paths = {
        "boot": boot,
        "cwd": boot / "cwd",
        "state": boot / "cwd" / ".state",
        "driver": boot / "cwd" / ".state" / "driver",
        "providers": boot / "cwd" / ".state" / "providers",
    }
    for p in paths.values():
        p.mkdir(parents=True, exist_ok=True)
    (paths["driver"] / "journal.sqlite3").write_text("journal")
    (paths["state"] / "driver.lock").write_text("1\n")
    (paths["providers"] / "home.txt").write_text("provider home")
    (boot / "next.boot.json").write_text("secret payload")
    (paths["cwd"] / "work.txt").write_text("work")
    for p in [tmp_path, *paths.values()]:
        p.chmod(0o777)  # the unprivileged run below reads them
    return paths


def test_plan_covers_deepest_last_and_binds_the_visible_back(tmp_path: Path) -> None:
    p = layout(tmp_path)
    plan = hiding.plan([p["driver"], p["state"] / "driver.lock"], [p["state"], p["cwd"]], [p["boot"]])
    assert plan.not_hidden == []
    a = plan.args
    # The boot folder is covered first, cwd bound back into it, then state_dir/driver covered inside.
    assert a.index(str(p["boot"])) < a.index(str(p["cwd"])) < a.index(str(p["driver"]))
    assert ["--ro-bind", os.devnull, str(p["state"] / "driver.lock")] == a[
        a.index("--ro-bind") : a.index("--ro-bind") + 3
    ]
    # Only the driver's folder is read-only; the boot folder's cover takes a tool's scratch files.
    assert a[-2:] == ["--remount-ro", str(p["driver"])] and a.count("--remount-ro") == 1


def test_a_folder_that_is_also_visible_or_the_root_is_not_hidden_and_said_so(tmp_path: Path) -> None:
    p = layout(tmp_path)
    plan = hiding.plan([p["cwd"], Path("/"), tmp_path / "missing"], [p["cwd"]])
    assert plan.args == [] and plan.hidden == []
    assert [n["path"] for n in plan.not_hidden] == [str(p["cwd"]), "/"]


PROBE = (
    'for f in "$D/journal.sqlite3" "$S/driver.lock" "$B/next.boot.json"; do '
    'if [ -s "$f" ] && cat "$f" >/dev/null 2>&1; then echo "read $f"; else echo "hidden $f"; fi; done; '
    'echo x > "$D/journal.sqlite3" 2>/dev/null && echo "wrote journal"; '
    'echo scratch > "$B/tmpfile" && echo "wrote scratch"; '
    'cat "$S/providers/home.txt"; echo; cat "$C/work.txt"; echo'
)


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap is not installed")
@pytest.mark.parametrize("uid", [None, 10001], ids=["as-driver-uid", "unprivileged"])
def test_bwrap_hides_the_driver_state_and_keeps_the_work(
    tmp_path: Path, uid: int | None, request: pytest.FixtureRequest
) -> None:
    if uid is not None and os.geteuid() != 0:
        pytest.skip("switching uid needs root")  # the as-driver-uid case covers a non-root driver
    if uid is not None:
        # pytest's own folder is root's (0700): the unprivileged driver owns a folder of its own.
        tmp_path = Path(tempfile.mkdtemp(prefix="hiding-", dir="/tmp"))
        request.addfinalizer(lambda: shutil.rmtree(tmp_path, ignore_errors=True))
    p = layout(tmp_path)
    if uid is not None:
        for path in [tmp_path, *tmp_path.rglob("*")]:
            os.chown(path, uid, uid)
    plan = hiding.plan([p["driver"], p["state"] / "driver.lock"], [p["state"], p["cwd"]], [p["boot"]])
    switch = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"] if uid is not None else []
    env = {"D": str(p["driver"]), "S": str(p["state"]), "B": str(p["boot"]), "C": str(p["cwd"]), "PATH": os.defpath}
    out = subprocess.run(
        [*switch, "bwrap", "--unshare-pid", "--dev-bind", "/", "/", *plan.args, "--", "sh", "-c", PROBE],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[:3] == [
        f"hidden {p['driver']}/journal.sqlite3",
        f"hidden {p['state']}/driver.lock",
        f"hidden {p['boot']}/next.boot.json",
    ]
    assert "wrote journal" not in lines
    assert lines[3:] == ["wrote scratch", "provider home", "work"]
    assert (p["driver"] / "journal.sqlite3").read_text() == "journal"  # outside, untouched
    assert not (p["boot"] / "tmpfile").exists()  # the scratch file went to the cover, then away


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap is not installed")
def test_mounts_bwrap_refuses_keep_the_pid_namespace_and_are_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from driver.containment import wrapper as containment

    (tmp_path / "driver").mkdir()
    monkeypatch.setattr(containment, "_private", ([tmp_path / "driver"], [], []))
    monkeypatch.setattr(containment, "_degraded", [])
    refused = hiding.Plan(args=["--bind", str(tmp_path / "missing"), str(tmp_path / "driver")], hidden=["x"])
    monkeypatch.setattr(hiding, "plan", lambda *_: refused)
    base = ["bwrap", "--unshare-pid", "--dev-bind", "/", "/", "--"]
    assert containment._with_mounts(base) == base  # the namespace without the mounts
    (report,) = containment.take_degraded()
    assert report["code"] == "containment.degraded" and "refused the mounts" in report["message"]
    assert report["details"] == {
        "mode": "pidns",
        "visible": [{"path": str(tmp_path / "driver"), "reason": report["details"]["visible"][0]["reason"]}],
    }
    assert containment.take_degraded() == []  # once


def test_what_the_execution_names_for_the_provider_stays_visible_inside_the_boot_folder(tmp_path: Path) -> None:
    import msgspec

    from driver.protocol.boot import BootPayload

    boot_dir = tmp_path / "session"
    (boot_dir / "codex-home").mkdir(parents=True)
    (boot_dir / "tmp").mkdir()
    payload = msgspec.convert(
        {
            "protocol": 1,
            "driver_instance_id": "drv-1",
            "control": {"url": "ws://127.0.0.1:1/driver", "token": "t" * 20},
            "session": {"id": "s", "agent_id": "a", "kind": "cattle", "cwd": str(tmp_path / "cwd"),
                        "state_dir": str(boot_dir / "state")},
            "execution": {"revision": "r", "runtime": "acp", "environment": {"KEY": "sk-secret", "ROOTISH": "/nope/x"},
                          "acp": {"command": ["codex-acp"], "env": {"CODEX_HOME": str(boot_dir / "codex-home"),
                                                                    "TMPDIR": str(boot_dir / "tmp")}}},
        },
        BootPayload,
    )  # fmt: skip
    hidden, visible, scratch = hiding.private_paths(payload, boot_dir / "boot.json")
    assert scratch == [boot_dir] and hidden[0] == boot_dir / "state" / "driver"
    assert boot_dir / "codex-home" in visible and boot_dir / "tmp" in visible
    assert Path("sk-secret") not in visible and Path("/nope/x") not in visible  # not paths, or missing
    plan = hiding.plan(hidden, visible, scratch)
    home = str((boot_dir / "codex-home").resolve())
    i = plan.args.index(home)
    assert plan.args[i - 1 : i + 2] == ["--bind", home, home]  # bound back into the covered boot folder
