"""The outbox is flushed on every way out of the driver (issue 30): an exception that leaves the
kernel's body after a diagnostic was admitted (the path that ended in exit 70) must not lose it; the
next process resends what the journal holds. In-process, so the failure can be placed exactly."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import anyio
import pytest

from driver.boot import parse_payload
from driver.kernel.core import Kernel
from driver.kernel.lifecycle import Lifecycle
from driver.queue.journal import Journal
from driver.queue.rowmac import RowMac, derive_key
from tests.integration.harness import INSTANCE, TOKEN, boot_payload

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the driver's own loop


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_a_diagnostic_admitted_before_an_escaping_error_is_journaled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    boot = parse_payload(json.dumps(boot_payload(tmp_path, f"ws://127.0.0.1:{closed_port()}/driver")).encode())

    async def recover_then_fail(self: Lifecycle) -> None:
        await self.k.emit("diagnostic.reported", {"code": "test.last_words", "severity": "error", "message": "x"})
        raise RuntimeError("an error no unit caught")

    monkeypatch.setattr(Lifecycle, "recover", recover_then_fail)
    kernel = Kernel(boot, started_at=anyio.current_time())
    with anyio.fail_after(30), pytest.raises(ExceptionGroup) as raised:
        await kernel.serve()
    assert "an error no unit caught" in repr(raised.value)
    journal = Journal(
        Path(boot.session.state_dir) / "driver" / "journal.sqlite3", mac=RowMac(derive_key(TOKEN, INSTANCE))
    )
    try:
        kinds = [meta.kind for meta in journal.pending()]
        bodies, _ = journal.bodies([meta.seq for meta in journal.pending()])
    finally:
        journal.close()
    assert "diagnostic.reported" in kinds
    said: list[dict[str, Any]] = [json.loads(b) for b in bodies.values()]
    assert any(b.get("payload", b).get("code") == "test.last_words" for b in said)
