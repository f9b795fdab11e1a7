"""The agent cannot brick its driver (issue 30, PROTOCOL §9, THREATS.md items 4 and 5).

Through the REAL driver process and a real ACP agent (our stubborn agent, whose `[[shell:]]` tool runs
a command as the agent would): the agent replaces its own `$HOME` (the provider home under
`state_dir/providers/`) with a file, then kills its provider. The provider's replacement must not
raise out of the supervision boundary: the file is set aside (kept, renamed) and reported, the
provider restarts, the next run completes, and a later driver start on the same `state_dir` starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.integration.harness import INSTANCE, boot_payload, control_plane
from tests.kernel.support import Driver, wait_diagnostic, wait_provider

FAST = {
    "AGENT_DRIVER_CANCEL_GRACE_MS": "300",
    "AGENT_DRIVER_TERM_GRACE_MS": "300",
    "AGENT_DRIVER_RESTART_BACKOFF_MS": "20",
    "AGENT_DRIVER_RESTART_BACKOFF_CAP_MS": "100",
}


def home_of(tmp: Path) -> Path:
    return tmp / "state" / "providers" / "acp" / "home"


async def run(cp: Any, run_id: str, text: str, timeout: float = 30) -> dict[str, Any]:
    cid, _ = await cp.send_command(INSTANCE, "input.start", run_id=run_id, input={"text": text})
    status: dict[str, Any] = await cp.wait_for_command_status(cid, timeout=timeout)
    return status


def set_aside_copies(home: Path) -> list[Path]:
    return sorted(home.parent.glob(f"{home.name}.set-aside-*"))


async def test_home_replaced_by_a_file_then_provider_killed(tmp_path: Path, drivers: list[Driver]) -> None:
    home = home_of(tmp_path)
    async with control_plane(tmp_path) as cp:
        payload = boot_payload(tmp_path, cp.url)
        payload["execution"]["permission_policy"] = "full_access"
        d = Driver(tmp_path, payload, env=FAST)
        drivers.append(d)
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=20)
        await wait_provider(d)
        assert home.is_dir()
        # The agent's own tool: its home becomes a file, then it kills its own provider.
        script = 'rm -rf "$HOME" && printf planted > "$HOME" && kill -9 $PPID'
        first = await run(cp, "run-1", f"[[own-shell:{script}]]")
        assert first["status"] == "failed"  # the run the kill interrupted fails; nothing else does
        aside = await wait_diagnostic(cp, "provider.home_set_aside")
        assert aside["payload"]["severity"] == "warning"
        details = aside["payload"]["details"]
        assert details["path"].endswith("providers/acp/home")
        await wait_diagnostic(cp, "provider.restarted", after_seq=aside["seq"])
        assert d.proc.poll() is None  # the driver stayed up
        second = await run(cp, "run-2", "[[say:still here]]")
        assert second["status"] == "completed"
        assert home.is_dir()
        [kept] = set_aside_copies(home)  # the agent's file is kept, never deleted
        assert kept.read_text() == "planted" and details["set_aside_as"] == kept.name

        # A later start on the same state_dir starts (the home is a folder again, and it would be set
        # aside again if it were not: see the next test).
        await cp.send_command(INSTANCE, "session.stop", reason="done")
        assert await d.wait(15) == 0
    async with control_plane(tmp_path) as cp:
        again = Driver(tmp_path, boot_payload(tmp_path, cp.url), env=FAST, name="driver-2")
        drivers.append(again)
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=20)
        assert (await run(cp, "run-3", "[[say:third]]"))["status"] == "completed"


async def test_a_start_on_a_state_dir_whose_home_is_a_file_starts(tmp_path: Path, drivers: list[Driver]) -> None:
    home = home_of(tmp_path)
    home.parent.mkdir(parents=True)
    home.write_text("planted")  # what an agent left before its driver died
    async with control_plane(tmp_path) as cp:
        d = Driver(tmp_path, boot_payload(tmp_path, cp.url), env=FAST)
        drivers.append(d)
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=20)
        aside = await wait_diagnostic(cp, "provider.home_set_aside")
        assert aside["payload"]["details"]["set_aside_as"].startswith("home.set-aside-")
        assert (await run(cp, "run-1", "[[say:up]]"))["status"] == "completed"
        assert home.is_dir() and d.proc.poll() is None
        [kept] = set_aside_copies(home)
        assert kept.read_text() == "planted"


async def test_provider_folder_replaced_by_a_link_is_set_aside(tmp_path: Path, drivers: list[Driver]) -> None:
    """A link where `providers/acp` should be is never followed: the folder is made where it stands."""
    outside = tmp_path / "outside"
    outside.mkdir()
    provider_dir = home_of(tmp_path).parent
    provider_dir.parent.mkdir(parents=True)
    provider_dir.symlink_to(outside)
    async with control_plane(tmp_path) as cp:
        d = Driver(tmp_path, boot_payload(tmp_path, cp.url), env=FAST)
        drivers.append(d)
        await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=20)
        await wait_diagnostic(cp, "provider.home_set_aside")
        assert (await run(cp, "run-1", "[[say:up]]"))["status"] == "completed"
        assert provider_dir.is_dir() and not provider_dir.is_symlink()
        assert list(outside.iterdir()) == []  # nothing was made through the link
