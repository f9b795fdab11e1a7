"""The model proxy's address and placeholders across a reattach (PROTOCOL §6.7, §8.2).

A kept provider outlives its driver with the proxy URL and the placeholders it was started with in its
environment (and, for Codex, in its config). So with `reattach_grace_ms > 0`, once a provider is running
under a keeper, `state_dir/driver/keeper/proxy.json` records the proxy's port, the keeper it belongs to
(the keeper record's nonce) and, for each withheld secret, a keyed digest of the provider's placeholder
(`keeper.state.keyed`, under the journal's key). The file is MAC'd like the keeper's other files and
hidden from the provider tree (§9). No placeholder is written in clear: a placeholder is not a secret of
the upstream, but it is what the proxy accepts in the secret's place, so the file holds only what lets
the successor recognise it, never what one could present. The next driver process listens on that port
again (elsewhere, with a warning, when it has been taken meanwhile) and accepts those placeholders while
the provider it runs is that keeper's; a provider it spawns fresh gets fresh placeholders and the old
ones stop working (`room.ProxyRoom.provider_started`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

from driver.keeper import state as keeper_state

FILE = "proxy.json"
PURPOSE = "model_proxy_placeholder"


@dataclass(frozen=True, slots=True)
class Saved:
    port: int
    keeper_nonce: str
    digests: dict[str, str]  # keyed digest of a placeholder -> the secret's name


def digest(placeholder: str) -> str:
    return keeper_state.keyed(PURPOSE, placeholder)


def _path(state_dir: Path) -> Path:
    return keeper_state.keeper_dir(state_dir) / FILE


def remember(state_dir: Path, port: int, placeholders: dict[str, str], keeper_nonce: str) -> None:
    """`placeholders`: secret name -> the placeholder the provider just started under a keeper holds."""
    digests = {digest(value): name for name, value in placeholders.items()}
    keeper_state.write_json(_path(state_dir), {"port": port, "keeper": keeper_nonce, "digests": digests})


def forget(state_dir: Path) -> None:
    with contextlib.suppress(OSError):
        _path(state_dir).unlink()


def read(state_dir: Path) -> Saved | None:
    """The record when its MAC checks and it belongs to the keeper recorded now, still alive."""
    raw = keeper_state.read_json(_path(state_dir))
    if not isinstance(raw, dict):
        return None
    port, nonce, digests = raw.get("port"), raw.get("keeper"), raw.get("digests")
    if not (isinstance(port, int) and 0 < port < 65536 and isinstance(nonce, str) and isinstance(digests, dict)):
        return None
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in digests.items()):
        return None
    record = keeper_state.read_record(state_dir)
    if record is None or record.nonce != nonce or not record.alive():
        return None
    return Saved(port, nonce, dict(digests))


def current_keeper(state_dir: Path) -> str | None:
    """The nonce of the keeper recorded now (None: no provider is kept)."""
    record = keeper_state.read_record(state_dir)
    return record.nonce if record is not None else None
