"""Starting a keeper (driver/keeper/keeper.py, PROTOCOL §8.2): its files and socket under
`state_dir/driver/keeper/`, the bwrap command that makes it pid 1 of a PID namespace not tied to this
driver, its configuration on stdin (never argv or the environment), and its record. Talking to the
started keeper is `driver.keeper.kept.KeptProcess`'s job."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from subprocess import DEVNULL, PIPE

import anyio
import anyio.abc

from driver import containment
from driver.adapters.common.base import ProviderError
from driver.adapters.common.environment import child_env
from driver.keeper.state import (
    KeeperError,
    Record,
    children,
    discard,
    fingerprint,
    keeper_dir,
    socket_address,
    write_json,
)

KEEPER_PY = Path(__file__).with_name("keeper.py")
CONNECT_TIMEOUT_S = 10.0


_refusal_said = False


def supported() -> bool:
    """Reattach needs the PID namespace: its pid 1 (the keeper) ends every process in it. And it needs
    its files hidden (PROTOCOL §9, per feature): its logs are the provider's output and the driver's input
    as the keeper wrote them, unauthenticated, which a successor would act on. Where the driver's state
    is visible, reattach is refused, and said once (`containment.degraded{feature: reattach}`)."""
    global _refusal_said
    if containment.mode_of(containment.prefix()) != "pidns":
        return False
    if containment.state_visible():
        if not _refusal_said:
            _refusal_said = True
            containment.degraded_feature(
                "reattach",
                "refused",
                "reattach is refused: the keeper's logs would be visible to the provider's tools; "
                "a driver restart ends the run driver.restarted",
            )
        return False
    return True


def keeper_prefix() -> list[str]:
    """The containment's bwrap command, not tied to this driver: without --die-with-parent, and with
    the keeper (instead of the shell that relays to the provider) as the namespace's pid 1."""
    base = containment.prefix()
    cut = base.index("--")
    return [a for a in base[:cut] if a != "--die-with-parent"] + ["--", sys.executable, "-I", str(KEEPER_PY)]


async def launch(
    argv: list[str],
    *,
    env: Mapping[str, str],
    cwd: str | Path,
    state_dir: Path,
    runtime: str,
    grace_ms: int,
    log_max_bytes: int,
) -> tuple[anyio.abc.Process, Record]:
    """Start a keeper holding `argv` and record it; the bwrap process and the record, for `attach`."""
    if not Path(cwd).is_dir():
        raise ProviderError("provider.missing", f"working directory {cwd} not found")
    folder = keeper_dir(state_dir)
    discard(state_dir)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    sock_path = folder / "sock"
    with contextlib.suppress(OSError):
        sock_path.unlink()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    out_fd = in_fd = -1
    try:
        with socket_address(state_dir) as address:
            listener.bind(address)
        os.chmod(sock_path, 0o600)
        listener.listen(4)
        flags = os.O_CREAT | os.O_TRUNC | os.O_RDWR | os.O_APPEND
        out_fd = os.open(folder / "out.log", flags, 0o600)
        in_fd = os.open(folder / "in.log", flags, 0o600)
        fds = (listener.fileno(), out_fd, in_fd)
        for fd in fds:
            os.set_inheritable(fd, True)
        prefix = await anyio.to_thread.run_sync(keeper_prefix)
        bwrap = await anyio.open_process(
            prefix,
            stdin=PIPE,
            stdout=DEVNULL,
            stderr=DEVNULL,
            cwd=str(cwd),
            env={"PATH": os.environ.get("PATH", os.defpath)},
            start_new_session=True,
            pass_fds=fds,
        )
    finally:
        listener.close()
        for fd in (out_fd, in_fd):
            if fd >= 0:
                os.close(fd)
    # The secret is derived (keyed) from a nonce: the record keeps the nonce, never the secret itself.
    nonce = secrets.token_hex(16)
    record_fields = {"nonce": nonce, "runtime": runtime, "fingerprint": fingerprint()}
    config = {
        "secret": Record(0, 0, 0, **record_fields).secret,
        "argv": argv,
        "env": child_env(env),  # the provider's, by value (driver/adapters/common/environment.py)
        "cwd": str(cwd),
        "grace_ms": grace_ms,
        "log_max_bytes": log_max_bytes,
        "listen_fd": fds[0],
        "out_fd": fds[1],
        "in_fd": fds[2],
    }
    assert bwrap.stdin is not None
    await bwrap.stdin.send(json.dumps(config).encode())
    await bwrap.stdin.aclose()
    keeper_pid = 0
    with anyio.move_on_after(CONNECT_TIMEOUT_S):
        # No event says when bwrap has forked its pid 1: look in /proc (a few ms).
        while not (kids := children(bwrap.pid)) and bwrap.returncode is None:  # noqa: ASYNC110
            await anyio.sleep(0.005)
        keeper_pid = kids[0] if kids else 0
    start = containment.start_time(keeper_pid) if keeper_pid else None
    if start is None:
        with contextlib.suppress(ProcessLookupError):
            bwrap.kill()
        raise KeeperError("the keeper did not start")
    record = Record(bwrap.pid, keeper_pid, start, **record_fields)
    write_json(folder / "record.json", {k: getattr(record, k) for k in Record.__slots__})  # type: ignore[attr-defined]
    return bwrap, record
