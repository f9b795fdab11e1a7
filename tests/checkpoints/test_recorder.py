"""The checkpoint room (driver/checkpoints/recorder.py) with the real journal and a stand-in for the rest
of the kernel (the events port records what it is given): incremental chunks, the 64 MiB bound, no
credential, a state forgotten after a final rejection."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest

from driver.checkpoints import chunks
from driver.checkpoints.recorder import Checkpointer
from driver.protocol.boot import BootPayload, NativeResume
from driver.protocol.events import validate_payload
from driver.queue.journal import Journal

REF = "01a23115-08c1-7fe0-80fc-15a658e80929"
KEY = "sk-fake-openai-0123456789"


@dataclass
class Provider:
    current: NativeResume | None


@dataclass
class Kernel:
    boot: BootPayload
    journal: Journal
    provider: Provider
    max_event_bytes: int = 4096
    emitted: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    async def emit(self, kind: str, payload: dict[str, Any]) -> str:
        validate_payload(kind, payload)  # what the real port checks
        self.emitted.append((kind, payload))
        return f"ev-{len(self.emitted)}"

    def take(self, kind: str) -> list[dict[str, Any]]:
        out = [p for k, p in self.emitted if k == kind]
        self.emitted.clear()
        return out


@pytest.fixture
def kernel(tmp_path: Path) -> Kernel:
    boot = msgspec.convert(
        {
            "protocol": 1,
            "driver_instance_id": "drv-1",
            "control": {"url": "ws://127.0.0.1:1/driver", "token": "t"},
            "session": {
                "id": "ses-1",
                "agent_id": "agt-1",
                "kind": "cattle",
                "cwd": str(tmp_path / "cwd"),
                "state_dir": str(tmp_path / "state"),
            },
            "execution": {"revision": "r", "runtime": "openai-app-server", "environment": {"OPENAI_API_KEY": KEY}},
        },
        BootPayload,
    )
    journal = Journal(tmp_path / "state" / "driver" / "journal.sqlite3")
    return Kernel(boot, journal, Provider(NativeResume(runtime="openai-app-server", value=REF)))


def rollout(tmp_path: Path) -> Path:
    path = tmp_path / "state/providers/openai-app-server/codex-home/sessions/2026/12/01"
    path.mkdir(parents=True)
    return path / f"rollout-2026-12-01T10-00-00-{REF}.jsonl"


def joined(pieces: list[dict[str, Any]]) -> bytes:
    return b"".join(base64.b64decode(p["data_b64"]) for p in pieces)


async def test_only_new_bytes_then_nothing_then_whole_files_after_a_rejection(kernel: Kernel, tmp_path: Path) -> None:
    room = Checkpointer(kernel)  # type: ignore[arg-type]
    f = rollout(tmp_path)
    f.write_bytes(b'{"n": 1}\n' * 1000)
    assert await room.after_run("run-1") is not None
    first = kernel.take("checkpoint.file")
    assert joined(first) == f.read_bytes() and first[0]["offset"] == 0 and len(first) > 1
    assert all(len(msgspec.json.encode(p)) <= kernel.max_event_bytes for p in first)

    with f.open("ab") as out:
        out.write(b'{"n": 2}\n')
    await room.after_run("run-2")
    grown = [p for k, p in kernel.emitted if k == "checkpoint.file"]
    [manifest] = [p for k, p in kernel.emitted if k == "checkpoint.recorded"]
    assert [p["offset"] for p in grown] == [9000] and joined(grown) == b'{"n": 2}\n'
    assert manifest["run_id"] == "run-2" and manifest["files"][0]["size"] == 9009
    kernel.emitted.clear()

    await room.at_stop()
    assert [k for k, _ in kernel.emitted] == ["checkpoint.recorded"]  # unchanged: the manifest alone
    assert kernel.take("checkpoint.recorded")[0]["run_id"] == "run-2"

    room.forget()
    await room.after_run("run-3")
    assert joined(kernel.take("checkpoint.file")) == f.read_bytes()


async def test_over_the_bound_is_a_diagnostic_and_no_checkpoint(
    kernel: Kernel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(chunks, "MAX_CHECKPOINT_BYTES", 1000)
    rollout(tmp_path).write_bytes(b"x" * 1001)
    assert await Checkpointer(kernel).after_run("run-1") is None  # type: ignore[arg-type]
    [(kind, payload)] = kernel.emitted
    assert kind == "diagnostic.reported" and payload["code"] == "checkpoint.too_large"
    assert payload["details"]["bytes"] == 1001


async def test_a_session_holding_a_credential_is_never_sent(kernel: Kernel, tmp_path: Path) -> None:
    rollout(tmp_path).write_text(f'{{"output": "OPENAI_API_KEY={KEY}"}}\n')
    assert await Checkpointer(kernel).after_run("run-1") is None  # type: ignore[arg-type]
    [(kind, payload)] = kernel.emitted
    assert kind == "diagnostic.reported" and payload["code"] == "checkpoint.withheld"
    assert KEY not in msgspec.json.encode(payload).decode()


async def test_no_room_for_the_events_is_a_diagnostic_never_a_cut(kernel: Kernel, tmp_path: Path) -> None:
    kernel.max_event_bytes = 200  # neither the manifest nor a chunk's fixed fields fit
    rollout(tmp_path).write_bytes(b"x" * 100)
    assert await Checkpointer(kernel).after_run("run-1") is None  # type: ignore[arg-type]
    assert [(k, p["code"]) for k, p in kernel.emitted] == [("diagnostic.reported", "checkpoint.too_large")]


async def test_no_current_session_no_checkpoint(kernel: Kernel, tmp_path: Path) -> None:
    rollout(tmp_path).write_bytes(b"x")
    kernel.provider.current = None
    assert await Checkpointer(kernel).after_run("run-1") is None  # type: ignore[arg-type]
    assert kernel.emitted == []


async def test_a_manifest_that_would_be_cut_is_never_sent(kernel: Kernel, tmp_path: Path) -> None:
    """§4.3 would shorten the manifest's file list: a checkpoint whose manifest does not fit is refused."""
    home = tmp_path / "state/providers/openai-app-server/codex-home/sessions/2026/12"
    for day in range(1, 29):
        (home / f"{day:02d}").mkdir(parents=True)
        (home / f"{day:02d}" / f"rollout-2026-12-{day:02d}T10-00-00-{REF}.jsonl").write_bytes(b"x")
    kernel.max_event_bytes = 2048
    assert await Checkpointer(kernel).after_run("run-1") is None  # type: ignore[arg-type]
    [(kind, payload)] = kernel.emitted
    assert (kind, payload["code"], payload["details"]["files"]) == ("diagnostic.reported", "checkpoint.too_large", 28)


def test_sizes_are_measured_before_reading_and_odd_files_are_refused(tmp_path: Path) -> None:
    """PROTOCOL §9 (driver/checkpoints/source.py): the survey sums `fstat` sizes against the budget before a
    byte is read, and a fifo, a link or a device is refused rather than opened for reading."""
    import os

    from driver.checkpoints import layout, source

    home = tmp_path / "home"
    (home / "s").mkdir(parents=True)
    for i in range(2):
        with (home / "s" / f"giant{i}").open("wb") as f:
            f.truncate(chunks.MAX_CHECKPOINT_BYTES // 2 + 1)  # sparse: no disk
    with pytest.raises(source.TooLarge) as too_large:
        source.survey(home, ["s/giant0", "s/giant1"])
    assert too_large.value.total == chunks.MAX_CHECKPOINT_BYTES + 2
    os.mkfifo(home / "s" / "fifo")
    (home / "s" / "link").symlink_to(home / "s" / "giant0")
    for name in ("fifo", "link"):
        with pytest.raises(source.CheckpointError):
            source.survey(home, [f"s/{name}"])
    with pytest.raises(source.CheckpointError, match="not a regular file"):
        source.survey(Path("/"), ["dev/zero"])  # a device
    # Folders deeper than a session's, or more files than one holds, are refused while walking.
    deep = home / "projects" / "-w" / REF
    (deep / "/".join(f"d{i}" for i in range(layout.MAX_DEPTH + 1))).mkdir(parents=True)
    (home / "projects" / "-w" / f"{REF}.jsonl").write_text("{}\n")
    with pytest.raises(layout.TooMany):
        layout.session_files(layout.Layout("claude", home), REF)


async def test_a_file_that_changes_between_its_passes_fails_the_checkpoint(
    kernel: Kernel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The manifest's sha256 is of what was measured; bytes sent that hash otherwise fail the checkpoint
    (`checkpoint.failed`) instead of recording a manifest the sent bytes do not match."""
    from driver.checkpoints import source

    f = rollout(tmp_path)
    f.write_bytes(b"a" * 5000)
    real = source.Pieces

    def swapped(*args: Any) -> source.Pieces:
        f.write_bytes(b"b" * 5000)  # the agent rewrites the file between the digest and the send
        return real(*args)

    monkeypatch.setattr(source, "Pieces", swapped)
    assert await Checkpointer(kernel).after_run("run-1") is None  # type: ignore[arg-type]
    codes = [p["code"] for k, p in kernel.emitted if k == "diagnostic.reported"]
    assert codes == ["checkpoint.failed"] and not [k for k, _ in kernel.emitted if k == "checkpoint.recorded"]
