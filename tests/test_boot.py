"""Boot payload (PROTOCOL §1): every refusal exits 78 with one line naming the problem, the file is
gone afterwards, and the token never appears in the output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from driver.boot import BootError, read_boot_payload

TOKEN = "tok-SECRET-value-123"


def payload(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    p: dict[str, Any] = {
        "protocol": 1,
        "driver_instance_id": "drv-test.1",
        "control": {"url": "ws://127.0.0.1:1/driver", "token": TOKEN},
        "session": {
            "id": "ses-1",
            "agent_id": "agt-1",
            "kind": "cattle",
            "cwd": str(tmp_path / "cwd"),
            "state_dir": str(tmp_path / "state"),
        },
        "execution": {"revision": "rev-1", "runtime": "claude-agent-sdk"},
    }
    p.update(overrides)
    return p


def write(path: Path, data: bytes | str, mode: int = 0o600) -> Path:
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    path.chmod(mode)
    return path


def run_driver(boot: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "AGENT_DRIVER_BOOT_FILE"}
    return subprocess.run(
        [sys.executable, "-m", "driver.cli", "run", "--boot-file", str(boot)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_valid_payload_is_read_and_deleted(tmp_path: Path) -> None:
    f = write(tmp_path / "boot.json", json.dumps(payload(tmp_path)))
    boot = read_boot_payload(str(f))
    assert boot.control.token == TOKEN
    assert boot.session.idle_exit_ms == 300_000
    assert not f.exists()


def test_mode_0400_is_accepted(tmp_path: Path) -> None:
    f = write(tmp_path / "boot.json", json.dumps(payload(tmp_path)), 0o400)
    assert read_boot_payload(str(f)).driver_instance_id == "drv-test.1"


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda p: p.pop("control"), "control"),
        (lambda p: p["control"].update(token=5), "control.token"),
        (lambda p: p["execution"].update(runtime="gpt-cli"), "execution.runtime"),
        (lambda p: p.update(driver_instance_id="bad id!"), "driver_instance_id"),
        (lambda p: p.update(protocol=2), "protocol"),
        (lambda p: p["session"].update(kind="goat"), "session.kind"),
        (lambda p: p["session"].update(surprise=1), "surprise"),
    ],
)
def test_schema_errors_name_the_field(tmp_path: Path, mutate: Any, field: str) -> None:
    p = payload(tmp_path)
    mutate(p)
    f = write(tmp_path / "boot.json", json.dumps(p))
    with pytest.raises(BootError) as info:
        read_boot_payload(str(f))
    assert info.value.exit_code == 78
    assert field in str(info.value)
    assert TOKEN not in str(info.value)
    assert not f.exists()


def test_symlink_is_refused_and_removed_target_kept(tmp_path: Path) -> None:
    target = write(tmp_path / "real.json", json.dumps(payload(tmp_path)))
    link = tmp_path / "boot.json"
    link.symlink_to(target)
    with pytest.raises(BootError, match="symlink"):
        read_boot_payload(str(link))
    assert not link.is_symlink() and not link.exists()
    assert target.exists()  # only the link is ours to remove


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o644])
def test_open_modes_are_refused(tmp_path: Path, mode: int) -> None:
    f = write(tmp_path / "boot.json", json.dumps(payload(tmp_path)), mode)
    with pytest.raises(BootError, match="mode"):
        read_boot_payload(str(f))
    assert not f.exists()


def test_other_owner_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("changing a file's owner needs root")  # CI and dev machines here run as root
    f = write(tmp_path / "boot.json", json.dumps(payload(tmp_path)))
    os.chown(f, 12345, 12345)
    with pytest.raises(BootError, match="owned by uid 12345"):
        read_boot_payload(str(f))
    assert not f.exists()


def test_over_one_mib_is_refused(tmp_path: Path) -> None:
    p = payload(tmp_path)
    p["execution"]["system_prompt"] = "x" * (1024 * 1024)
    f = write(tmp_path / "boot.json", json.dumps(p))
    with pytest.raises(BootError, match="1 MiB"):
        read_boot_payload(str(f))
    assert not f.exists()


def test_invalid_json_is_refused(tmp_path: Path) -> None:
    f = write(tmp_path / "boot.json", '{"protocol": 1, "control": {"token": "' + TOKEN + '"')
    with pytest.raises(BootError, match="not valid JSON") as info:
        read_boot_payload(str(f))
    assert TOKEN not in str(info.value)
    assert not f.exists()


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(BootError, match="not found"):
        read_boot_payload(str(tmp_path / "nope.json"))


def test_process_exits_78_with_one_line_and_no_token(tmp_path: Path) -> None:
    p = payload(tmp_path)
    p["control"]["url"] = 12
    f = write(tmp_path / "boot.json", json.dumps(p))
    proc = run_driver(f)
    assert proc.returncode == 78
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "control.url" in lines[0]
    assert TOKEN not in proc.stderr + proc.stdout
    assert not f.exists()


def test_plain_ws_to_a_remote_host_is_refused(tmp_path: Path) -> None:
    p = payload(tmp_path)
    p["control"]["url"] = "ws://cp.example.com/driver"
    f = write(tmp_path / "boot.json", json.dumps(p))
    proc = run_driver(f)
    assert proc.returncode == 78
    assert "control.url" in proc.stderr and "insecure_transport" in proc.stderr
    assert TOKEN not in proc.stderr
    assert not f.exists()


def test_acp_runtime_requires_acp_block(tmp_path: Path) -> None:
    p = payload(tmp_path)
    p["execution"]["runtime"] = "acp"
    f = write(tmp_path / "boot.json", json.dumps(p))
    with pytest.raises(BootError, match=r"execution\.acp"):
        read_boot_payload(str(f))


# --- issue 11 §1 hardening -------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [0o700, 0o500, 0o200, 0o000, 0o4600, 0o1600])
def test_only_0600_and_0400_pass(tmp_path: Path, mode: int) -> None:
    f = write(tmp_path / "boot.json", json.dumps(payload(tmp_path)), mode)
    with pytest.raises(BootError, match="mode") as info:
        read_boot_payload(str(f))
    assert info.value.exit_code == 78
    assert not f.exists()


@pytest.mark.parametrize("mode", [0o644, 0o400, 0o600])
def test_payload_whose_unlink_fails_is_zeroed(tmp_path: Path, mode: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Refused for its mode (0644) or accepted (0400, 0600): if the unlink fails, the bytes are zeroed
    and the driver exits 1 (the sandbox is at fault)."""
    data = json.dumps(payload(tmp_path)).encode()
    f = write(tmp_path / "boot.json", data, mode)

    def refuse(path: object, *args: object, **kwargs: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "unlink", refuse)
    with pytest.raises(BootError, match="unlink") as info:
        read_boot_payload(str(f))
    monkeypatch.undo()
    assert info.value.exit_code == 1
    assert f.read_bytes() == b"\0" * len(data)
    assert TOKEN not in str(info.value)


def test_oversized_payload_whose_unlink_fails_is_zeroed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = payload(tmp_path)
    p["execution"]["system_prompt"] = "x" * (1024 * 1024)
    data = json.dumps(p).encode()
    f = write(tmp_path / "boot.json", data)
    monkeypatch.setattr(os, "unlink", lambda *a, **k: (_ for _ in ()).throw(PermissionError(1, "nope")))
    with pytest.raises(BootError, match="unlink"):
        read_boot_payload(str(f))
    monkeypatch.undo()
    assert f.read_bytes().count(0) == len(data)


def test_other_owner_whose_unlink_fails_is_zeroed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if os.geteuid() != 0:
        pytest.skip("changing a file's owner needs root")  # CI and dev machines here run as root
    data = json.dumps(payload(tmp_path)).encode()
    f = write(tmp_path / "boot.json", data)
    os.chown(f, 12345, 12345)
    monkeypatch.setattr(os, "unlink", lambda *a, **k: (_ for _ in ()).throw(PermissionError(1, "nope")))
    with pytest.raises(BootError, match="unlink"):
        read_boot_payload(str(f))
    monkeypatch.undo()
    assert f.read_bytes() == b"\0" * len(data)


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda p: p["session"].update(kind="SECRETKIND"), "session.kind"),
        (lambda p: p.update(protocol="SECRETKIND"), "protocol"),
        (lambda p: p["execution"].update(permission_policy="SECRETKIND"), "execution.permission_policy"),
        (lambda p: p["execution"].update(native_resume={"runtime": "SECRETKIND", "value": "v"}), "native_resume"),
        # An unknown key is named only when it looks like a field name (a typo to fix), never otherwise.
        (lambda p: p["session"].update({"SECRETKIND value=1": 1}), "session"),
        (lambda p: p["session"].update(idle_exit_ms=2**70), "session.idle_exit_ms"),
    ],
)
def test_schema_errors_never_echo_a_value(tmp_path: Path, mutate: Any, field: str) -> None:
    p = payload(tmp_path)
    mutate(p)
    f = write(tmp_path / "boot.json", json.dumps(p))
    with pytest.raises(BootError) as info:
        read_boot_payload(str(f))
    message = str(info.value)
    assert field in message
    assert "SECRETKIND" not in message
    assert str(2**70) not in message
    assert "\n" not in message


def test_missing_ca_file_exits_78(tmp_path: Path) -> None:
    p = payload(tmp_path)
    p["control"].update(url="wss://127.0.0.1:1/driver", ca_file=str(tmp_path / "missing-ca.pem"))
    f = write(tmp_path / "boot.json", json.dumps(p))
    proc = run_driver(f)
    assert proc.returncode == 78, proc.stderr
    assert "control.ca_file" in proc.stderr
    assert TOKEN not in proc.stderr


def test_unreadable_ca_file_exits_78(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nnot base64 !!\n-----END CERTIFICATE-----\n")
    p = payload(tmp_path)
    p["control"].update(url="wss://127.0.0.1:1/driver", ca_file=str(ca))
    f = write(tmp_path / "boot.json", json.dumps(p))
    proc = run_driver(f)
    assert proc.returncode == 78, proc.stderr
    assert "control.ca_file" in proc.stderr


def test_deeply_nested_payload_is_a_clear_error(tmp_path: Path) -> None:
    p = payload(tmp_path)
    p["execution"]["provider_options"] = {"x": "DEEP"}
    text = json.dumps(p).replace('"DEEP"', "[" * 5000 + "]" * 5000)
    f = write(tmp_path / "boot.json", text)
    with pytest.raises(BootError, match="nested") as info:
        read_boot_payload(str(f))
    assert info.value.exit_code == 78


@pytest.mark.parametrize("field", ["host_tool_timeout_ms", "permission_timeout_ms"])
def test_millisecond_fields_beyond_64_bits_are_refused(tmp_path: Path, field: str) -> None:
    p = payload(tmp_path)
    p["execution"][field] = 2**70
    f = write(tmp_path / "boot.json", json.dumps(p))
    with pytest.raises(BootError, match=field):
        read_boot_payload(str(f))


def _set(p: dict[str, Any], path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    node = p
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value


# Each number of the payload and its stated range (docs/protocol.md §1): just outside is refused.
RANGES = [
    ("session.idle_exit_ms", 100, 30 * 86_400_000),
    ("execution.permission_timeout_ms", 1_000, 86_400_000),
    ("execution.host_tool_timeout_ms", 1_000, 86_400_000),
    ("execution.reattach_grace_ms", 0, 3_600_000),
    ("execution.limits.provider_rss_mb", 16, 1_048_576),
    ("execution.model_proxy.budget.max_usd_per_run", 0, 1_000_000),
    ("execution.model_proxy.budget.max_usd_per_session", 0, 1_000_000),
    ("execution.model_proxy.budget.max_tokens_per_run", 0, 10**12),
]


def _with_proxy(p: dict[str, Any], path: str) -> None:
    if ".model_proxy." in path:
        p["execution"]["environment"] = {"ANTHROPIC_API_KEY": "k"}
        p["execution"]["model_proxy"] = {"secrets": ["ANTHROPIC_API_KEY"], "budget": {}}


@pytest.mark.parametrize(("path", "low", "high"), RANGES)
def test_every_number_outside_its_stated_range_is_refused_naming_the_field(
    tmp_path: Path, path: str, low: int, high: int
) -> None:
    for value in (low - 1, high + 1, 2**70, -(2**70)):
        p = payload(tmp_path)
        _with_proxy(p, path)
        _set(p, path, value)
        f = write(tmp_path / "boot.json", json.dumps(p))
        with pytest.raises(BootError) as info:
            read_boot_payload(str(f))
        assert info.value.exit_code == 78 and path.rsplit(".", 1)[1] in str(info.value), (path, value)


@pytest.mark.parametrize(("path", "low", "high"), RANGES)
def test_the_bounds_themselves_are_taken(tmp_path: Path, path: str, low: int, high: int) -> None:
    for value in (low, high):
        p = payload(tmp_path)
        _with_proxy(p, path)
        _set(p, path, value)
        read_boot_payload(str(write(tmp_path / "boot.json", json.dumps(p))))


def one_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def test_a_top_level_typo_is_named_with_the_field_it_meant(tmp_path: Path) -> None:
    p = payload(tmp_path)
    p["sesion"] = p.pop("session")
    proc = run_driver(write(tmp_path / "boot.json", json.dumps(p)))
    line = one_line(proc)
    assert proc.returncode == 78
    # Not "invalid payload: invalid payload" (issue 35): the field, and the one it most likely meant.
    assert "unknown field `sesion` at the top level (did you mean `session`?)" in line
    assert "mint a new one" in line and TOKEN not in proc.stderr


def test_a_missing_top_level_field_is_named(tmp_path: Path) -> None:
    p = payload(tmp_path)
    del p["session"]
    line = one_line(run_driver(write(tmp_path / "boot.json", json.dumps(p))))
    assert "missing required field `session` at the top level" in line


def test_a_refused_mode_and_the_rerun_both_say_to_mint_a_new_payload(tmp_path: Path) -> None:
    f = write(tmp_path / "boot.json", json.dumps(payload(tmp_path)), 0o644)
    proc = run_driver(f)
    line = one_line(proc)
    assert proc.returncode == 78
    assert "mode 0644 is refused" in line
    assert "the payload file is deleted (a payload is single-use): mint a new one (mode 0600)" in line
    assert "agent-driver controlplane boot" in line
    assert not f.exists()  # deleted before parsing, as PROTOCOL §1 asks
    again = run_driver(f)
    line = one_line(again)
    assert again.returncode == 78
    assert "payload file not found" in line and "single-use" in line and "mint a new one" in line
