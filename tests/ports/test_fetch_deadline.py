"""Downloads with an overall deadline, cancellable (driver.ports.fetch): the worker thread is
abandoned at once, wakes, and never renames its file into place."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from driver.ports.fetch import Download, FetchError, fetch, fetch_to
from tests.faults.test_slow_downloads import BODY, Trickle

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def trickle() -> Iterator[Trickle]:
    with Trickle() as t:
        yield t


SHA = hashlib.sha256(BODY).hexdigest()


async def test_the_deadline_ends_a_trickling_download(tmp_path: Path, trickle: Trickle) -> None:
    dest = tmp_path / "in" / "blob"
    t0 = time.monotonic()
    with pytest.raises(FetchError, match=r"within 0\.5 s|deadline"):
        await fetch(trickle.url, dest, sha256=SHA, max_bytes=len(BODY), deadline_s=0.5)
    assert time.monotonic() - t0 < 3
    assert await anyio.to_thread.run_sync(trickle.hung_up.wait, 10)  # the worker hung up
    assert not dest.exists()


async def test_a_cancel_abandons_the_download_at_once(tmp_path: Path, trickle: Trickle) -> None:
    dest = tmp_path / "in" / "blob"
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:
            async def go() -> None:
                await fetch(trickle.url, dest, sha256=SHA, max_bytes=len(BODY), deadline_s=60)

            tg.start_soon(go)
            assert await anyio.to_thread.run_sync(trickle.connected.wait, 10)
            t0 = time.monotonic()
            scope.cancel()
    assert time.monotonic() - t0 < 1
    assert await anyio.to_thread.run_sync(trickle.hung_up.wait, 10)
    assert not dest.exists()


def test_an_abandoned_download_is_never_renamed_into_place(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.write_bytes(b"data")
    dl = Download()
    dl.abandon()
    with pytest.raises(FetchError, match="abandoned"):
        digest = hashlib.sha256(b"data").hexdigest()
        fetch_to(src.as_uri(), tmp_path / "out" / "f", sha256=digest, max_bytes=9, download=dl)
    assert not (tmp_path / "out" / "f").exists()
    assert os.listdir(tmp_path / "out") == []


def test_a_fifo_behind_a_file_url_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(FetchError, match="not a regular file"):
        fetch_to((tmp_path / "pipe").as_uri(), tmp_path / "out" / "f", sha256="0" * 64, max_bytes=9)
