"""The reference control plane's native checkpoints (PROTOCOL §8.1): chunks reassembled as they are
stored (the driver's own chunker makes them), a manifest checked against what was reassembled, blobs
kept once, and `controlplane boot --resume-from` minting a payload whose files the driver's fetcher
accepts."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from agent_lab.controlplane import ControlPlane
from agent_lab.controlplane.cli import main as cli_main
from agent_lab.controlplane.store import Store
from agent_lab.controlplane.validation import ValidEvent, check_event

from driver.boot import read_boot_payload
from driver.checkpoints import chunks
from driver.ports.fetch import fetch_to
from tests.controlplane.client import INSTANCE, TOKEN, batch, event, handshake, http, recv, send
from tests.controlplane.test_boot import base_argv, mint
from tests.controlplane.test_http_api import printed_json

PATH = "sessions/2026/12/01/rollout-2026-12-01T10-00-00-thr-1.jsonl"


class Feed:
    """Checkpoint events, numbered, as the driver would admit them."""

    def __init__(self) -> None:
        self.seq = 0
        self.sent: dict[str, chunks.Sent] = {}

    def _event(self, kind: str, payload: dict[str, Any]) -> dict[str, Any]:
        self.seq += 1
        return event(self.seq, kind, run_id=None, payload=payload)

    def checkpoint(self, files: dict[str, bytes], limit: int = 2048, cid: str | None = None) -> list[dict[str, Any]]:
        cid = cid or f"ckpt-{self.seq}"
        out = []
        for path, data in files.items():
            offset = chunks.resume_offset(data, self.sent.get(path))
            if offset is not None:
                out += [self._event("checkpoint.file", p) for p in chunks.file_chunks(cid, path, data, offset, limit)]
            self.sent[path] = chunks.Sent(len(data), chunks.sha256_hex(data))
        body = chunks.manifest(cid, "run-1", "openai-app-server", "thr-1", files)
        out.append(self._event("checkpoint.recorded", body))
        return out


def valid(raw: dict[str, Any]) -> ValidEvent:
    checked = check_event(json.dumps(raw).encode())
    assert isinstance(checked, ValidEvent), checked
    return checked


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "s.db")


def test_chunks_are_reassembled_and_only_new_bytes_are_sent(store: Store) -> None:
    feed = Feed()
    first = b'{"line": 1}\n' * 500
    events = feed.checkpoint({PATH: first})
    assert len(events) > 3  # several chunks within the 2 KiB limit
    assert all(len(json.dumps(e["payload"], separators=(",", ":"))) <= 2048 for e in events[:-1])
    result = store.insert_events(INSTANCE, [valid(e) for e in events])
    assert not result.rejected and len(result.accepted) == len(events)

    grown = first + b'{"line": 2}\n' * 10
    events = feed.checkpoint({PATH: grown})
    file_events = [e for e in events if e["kind"] == "checkpoint.file"]
    assert [e["payload"]["offset"] for e in file_events] == [len(first)]  # only the new bytes
    assert not store.insert_events(INSTANCE, [valid(e) for e in events]).rejected

    stored = store.checkpoints(INSTANCE)
    assert [c["bytes"] for c in stored] == [len(first), len(grown)]
    assert store.checkpoint_blob(hashlib.sha256(grown).hexdigest()) == grown
    assert store.latest_checkpoint(INSTANCE)["files"][0]["sha256"] == hashlib.sha256(grown).hexdigest()  # type: ignore[index]


def test_an_unchanged_file_sends_no_chunk_and_a_rewritten_one_starts_over(store: Store) -> None:
    feed = Feed()
    data = b"a" * 3000
    store.insert_events(INSTANCE, [valid(e) for e in feed.checkpoint({PATH: data})])
    again = feed.checkpoint({PATH: data})
    assert [e["kind"] for e in again] == ["checkpoint.recorded"]
    rewritten = b"b" * 3100
    events = feed.checkpoint({PATH: rewritten})
    assert next(e["payload"]["offset"] for e in events if e["kind"] == "checkpoint.file") == 0
    assert not store.insert_events(INSTANCE, [valid(e) for e in again + events]).rejected
    assert store.latest_checkpoint(INSTANCE)["bytes"] == 3100  # type: ignore[index]


def test_a_resent_chunk_overwrites_itself_and_a_gap_or_bad_manifest_is_refused(store: Store) -> None:
    feed = Feed()
    events = feed.checkpoint({PATH: b"x" * 5000})
    file_events = [e for e in events if e["kind"] == "checkpoint.file"]
    store.insert_events(INSTANCE, [valid(e) for e in file_events])
    # A driver that crashed before it remembered what it sent sends the same bytes again (new ids).
    feed2 = Feed()
    feed2.seq = 100
    again = feed2.checkpoint({PATH: b"x" * 5000}, cid="ckpt-again")
    assert not store.insert_events(INSTANCE, [valid(e) for e in again]).rejected
    # A chunk past what is held: refused, not stored.
    gap = chunks.file_chunks("ckpt-gap", "sessions/2026/12/01/rollout-x-thr-2.jsonl", b"y" * 10, 5, 2048)[0]
    refused = store.insert_events(INSTANCE, [valid(event(200, "checkpoint.file", run_id=None, payload=gap))])
    assert [r.code for r in refused.rejected] == ["checkpoint.incomplete"] and not refused.accepted
    # A manifest whose sha256 does not match what was reassembled: refused, the checkpoint not kept.
    bad = chunks.manifest("ckpt-bad", "run-1", "openai-app-server", "thr-1", {PATH: b"z" * 5000})
    refused = store.insert_events(INSTANCE, [valid(event(201, "checkpoint.recorded", run_id=None, payload=bad))])
    assert [r.code for r in refused.rejected] == ["checkpoint.incomplete"]
    assert [c["checkpoint_id"] for c in store.checkpoints(INSTANCE)] == ["ckpt-again"]


def test_chunk_sizes_never_exceed_the_limit_and_join_back() -> None:
    data = bytes(range(256)) * 100
    for limit in (1024, 1500, 4096):
        pieces = chunks.file_chunks("ckpt-1", PATH, data, 0, limit)
        assert all(len(json.dumps(p, separators=(",", ":")).encode()) <= limit for p in pieces)
        import base64

        assert b"".join(base64.b64decode(p["data_b64"]) for p in pieces) == data
    assert len(chunks.file_chunks("ckpt-1", PATH, b"", 0, 1024)) == 1  # an empty file is still announced
    with pytest.raises(chunks.ChunkTooSmall):
        chunks.file_chunks("ckpt-1", "p" * 2000, data, 0, 1024)


async def test_boot_resume_from_writes_the_latest_checkpoint(
    cp: ControlPlane, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    feed = Feed()
    data = b'{"type": "session_meta"}\n' * 200
    ws, _ = await handshake(cp.url)
    await send(ws, batch(1, feed.checkpoint({PATH: data})))
    receipt = await recv(ws)
    assert receipt["type"] == "receipt" and not receipt["rejected"]
    await ws.close()
    status, listing = await asyncio.to_thread(http, cp.http_url, "GET", f"/api/instances/{INSTANCE}/checkpoints")
    assert status == 200 and len(listing["checkpoints"]) == 1
    # A file no checkpoint of this instance lists is not served.
    status, _ = await asyncio.to_thread(
        http, cp.http_url, "GET", f"/api/instances/{INSTANCE}/checkpoint-file?sha256={'0' * 64}"
    )
    assert status == 404

    token_file = tmp_path / "cp.token"
    token_file.write_text(TOKEN + "\n")
    argv = ["checkpoints", "--url", str(cp.http_url), "--token-file", str(token_file), "--instance", INSTANCE]
    assert await asyncio.to_thread(cli_main, argv) == 0
    assert printed_json(capsys.readouterr().out)["checkpoints"] == listing["checkpoints"]
    out = tmp_path / "boot.json"
    argv = [*base_argv(cp, token_file, out, "openai-app-server"), "--resume-from", INSTANCE]
    assert await mint(argv) == 0
    payload = read_boot_payload(str(out))
    restored = payload.execution.native_checkpoint
    assert restored is not None and restored.native_ref == "thr-1" and restored.runtime == "openai-app-server"
    [f] = restored.files
    assert f.path == PATH and f.size == len(data) and f.url.startswith("file:")
    # The driver's fetcher accepts it (hash and size checked).
    assert fetch_to(f.url, tmp_path / "placed" / "x.jsonl", sha256=f.sha256, max_bytes=f.size) == len(data)

    # Another runtime's driver cannot be given this checkpoint.
    out2 = tmp_path / "boot2.json"
    assert await mint([*base_argv(cp, token_file, out2, "claude-agent-sdk"), "--resume-from", INSTANCE]) == 2
    assert not out2.exists()
