"""What the provider tree must not see (PROTOCOL §9), as bwrap mount arguments.

The provider and everything it starts run in the mount namespace `driver.containment.wrapper` creates. In it,
each hidden folder (`state_dir/driver/`; the boot payload's folder, as "scratch": writable) is covered
by an empty tmpfs, and
each visible folder that lies inside a hidden one (`state_dir` and `cwd` inside the boot folder, the
driver's own runtime) is bound back over it. Covering the folder rather than listing its files also
hides what the driver writes there later (the journal's WAL, new records, the next boot payload).
A hidden file (the `state_dir` lock) gets /dev/null bound over it.

Mounts apply in order of depth, so a folder bound back inside a tmpfs can itself hold a hidden folder
(a `state_dir` inside a `cwd` inside the boot folder). A hidden folder that IS a visible one (a boot
file in `cwd`) or is `/` cannot be covered: it is left visible and named in `Plan.not_hidden`, which the
driver reports (`containment.degraded`). Only what exists is mounted over: bwrap would create a missing
mount point on the real file system.

Pure: paths in, arguments out (`os.path` lookups only); nothing here starts a process.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from driver.protocol.boot import BootPayload, ExecutionConfig


@dataclass(frozen=True, slots=True)
class Plan:
    args: list[str] = field(default_factory=list)  # bwrap arguments, before `--`
    hidden: list[str] = field(default_factory=list)
    not_hidden: list[dict[str, str]] = field(default_factory=list)  # {path, reason}


def _resolved(paths: Iterable[str | Path | None]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        if p:
            try:
                r = Path(p).resolve(strict=False)
            except (OSError, RuntimeError):
                continue
            if r not in out:
                out.append(r)
    return out


def plan(
    hidden: Iterable[str | Path | None],
    visible: Iterable[str | Path | None],
    scratch: Iterable[str | Path | None] = (),
) -> Plan:
    """The mounts that hide `hidden` (read-only covers) and `scratch` (writable covers: a boot folder
    may be `/tmp`, where the provider's tools must still write their temporary files, then lost),
    and keep every `visible` path inside them reachable."""
    shown = _resolved(visible)
    writable = _resolved(scratch)
    ops: list[tuple[int, int, list[str]]] = []
    covered: list[Path] = []
    result = Plan()
    for h in _resolved([*hidden, *writable]):
        if not h.exists():
            continue
        reason = None
        if h == Path(h.anchor):
            reason = "it is the root of the file system"
        elif h in shown:
            # A hidden folder inside a visible one is fine (a `state_dir` inside `cwd` is covered on
            # top of it); the very same folder cannot be both.
            reason = "it is also a folder the provider works in"
        if reason is not None:
            result.not_hidden.append({"path": str(h), "reason": reason})
            continue
        if h.is_dir():
            ops.append((len(h.parts), 0, ["--tmpfs", str(h)]))
        else:
            ops.append((len(h.parts), 0, ["--ro-bind", os.devnull, str(h)]))
        covered.append(h)
        result.hidden.append(str(h))
    for v in shown:
        if v.exists() and any(v != h and v.is_relative_to(h) for h in covered):
            ops.append((len(v.parts), 1, ["--bind", str(v), str(v)]))
    for _, _, args in sorted(ops, key=lambda o: (o[0], o[1])):
        result.args.extend(args)
    # Last, once every mount point inside them exists: the covers are read-only, so a tool that
    # "edits the journal" gets EROFS instead of writing a decoy it could mistake for the real one.
    for h in covered:
        if h.is_dir() and h not in writable:
            result.args.extend(["--remount-ro", str(h)])
    return result


def private_paths(payload: BootPayload, boot_path: Path) -> tuple[list[Path], list[Path], list[Path]]:
    """(hidden, visible, scratch) for a boot payload (PROTOCOL §9): the provider tree must not see
    `state_dir/driver/` nor the lock (hidden, read-only), nor the boot payload's folder (scratch: a
    writable cover, it may be `/tmp`). What it works in stays visible, also inside the boot folder:
    `state_dir` itself (its `providers/` is the provider's home), `cwd`, the other roots, the
    driver's own runtime, and every existing absolute path the execution names for the provider
    (an ACP agent's command or `CODEX_HOME`, an MCP server's script, `TMPDIR`)."""
    from driver.containment.statelock import LOCK_NAME
    from driver.kernel.options import project_root

    session = payload.session
    state_dir = Path(session.state_dir)
    # Covered or bound back: each must exist first (bwrap would create a missing mount point).
    (state_dir / "driver").mkdir(parents=True, exist_ok=True, mode=0o700)
    (state_dir / "providers").mkdir(parents=True, exist_ok=True, mode=0o700)
    visible = [
        state_dir,
        Path(session.cwd),
        *(Path(p) for p in [session.memory_dir, *session.additional_directories] if p),
        Path(sys.prefix),
        Path(sys.base_prefix),
        Path(__file__).resolve().parents[1],  # the driver package itself
        project_root(),
        *_named_paths(payload.execution),
    ]
    return [state_dir / "driver", state_dir / LOCK_NAME], visible, [boot_path.parent]


def _named_paths(execution: ExecutionConfig) -> list[Path]:
    values = [*execution.environment.values()]
    if execution.acp is not None:
        values += [*execution.acp.command, *execution.acp.env.values()]
    for server in execution.mcp_servers:
        values += [*server.command, *server.env.values()]
    # Only what looks like a path and exists: a value is often a secret, never mounted as one.
    return [Path(v) for v in values if v.startswith("/") and "\n" not in v and os.path.exists(v)]
