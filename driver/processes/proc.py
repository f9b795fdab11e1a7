"""One process of the process room (PROTOCOL §6.8): what the room, its commands and its output path
share about it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import anyio

from driver.processes import spawn as spawning
from driver.processes.ringfile import RingFile


@dataclass(eq=False)
class Proc:
    process_id: str
    argv: list[str]
    pty: tuple[int, int] | None
    spawned: spawning.Spawned
    ring: RingFile
    started: float = field(default_factory=time.monotonic)
    running: bool = True
    next_live: int = 0  # the offset of the first byte not yet sent live
    pending: bytes = b""  # the start of a character the next read completes
    exited: anyio.Event = field(default_factory=anyio.Event)
    output_done: anyio.Event = field(default_factory=anyio.Event)
    write_lock: anyio.Lock = field(default_factory=anyio.Lock)

    @property
    def pid(self) -> int:
        return self.spawned.proc.pid
