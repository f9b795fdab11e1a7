"""The best-effort buffer (PROTOCOL §4.1): bounded, coalescing, at most once, drops counted.

Consecutive deltas of the same message, thought or tool output are joined into one event (the first
one's seq and event_id), which is what keeps a fast token stream cheap on a slow link.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import msgspec

# The field that names the stream a delta belongs to, per best-effort kind.
STREAM_KEY: dict[str, str] = {
    "message.delta": "message_id",
    "thought.delta": "thought_id",
    "tool.output.delta": "tool_call_id",
}


class BestEffortEvent(msgspec.Struct):
    seq: int
    event_id: str
    run_id: str | None
    kind: str
    payload: bytes
    occurred_at: str
    # How many admitted events this one stands for after coalescing: a drop counts all of them, so
    # `dropped` + delivered always adds up to what was admitted.
    pieces: int = 1

    def encode(self, epoch: int, session_id: str) -> bytes:
        return msgspec.json.encode(
            {
                "event_id": self.event_id,
                "seq": self.seq,
                "epoch": epoch,
                "kind": self.kind,
                "delivery": "best_effort",
                "session_id": session_id,
                "run_id": self.run_id,
                "occurred_at": self.occurred_at,
                "payload": msgspec.Raw(self.payload),
            }
        )


class BestEffortBuffer:
    def __init__(self, max_events: int = 1024, max_bytes: int = 1024 * 1024) -> None:
        self.max_events = max_events
        self.max_bytes = max_bytes
        self._items: deque[BestEffortEvent] = deque()
        self._bytes = 0
        self.dropped = 0
        self._dropped_by_run: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._items)

    def add(self, event: BestEffortEvent) -> None:
        if self._items and self._coalesce(self._items[-1], event):
            return
        if len(self._items) >= self.max_events or self._bytes + len(event.payload) > self.max_bytes:
            self.count_drop(event.run_id)
            return
        self._items.append(event)
        self._bytes += len(event.payload)

    def _coalesce(self, last: BestEffortEvent, new: BestEffortEvent) -> bool:
        key = STREAM_KEY.get(new.kind)
        if key is None or last.kind != new.kind or last.run_id != new.run_id:
            return False
        a = msgspec.json.decode(last.payload)
        b = msgspec.json.decode(new.payload)
        if a.get(key) != b.get(key) or set(a) != {key, "text"} or set(b) != {key, "text"}:
            return False
        merged = msgspec.json.encode({key: a[key], "text": a["text"] + b["text"]})
        if self._bytes - len(last.payload) + len(merged) > self.max_bytes:
            return False
        self._bytes += len(merged) - len(last.payload)
        last.payload = merged
        last.pieces += new.pieces
        return True

    def take(
        self, max_events: int, max_bytes: int, encode: Callable[[BestEffortEvent], bytes], *, fill: bool = False
    ) -> list[tuple[BestEffortEvent, bytes]]:
        """Oldest first, each with its encoding, while their encodings (plus a separator each) fit in
        `max_bytes`. One that could never fit a batch on its own (coalesced deltas, or a batch size
        halved after a 1009) is dropped and counted: a batch never exceeds the limit (PROTOCOL §4.3)."""
        out: list[tuple[BestEffortEvent, bytes]] = []
        size = 0
        while self._items and len(out) < max_events:
            item = self._items[0]
            encoded = encode(item)
            if len(encoded) + 1 > max_bytes and not out and not fill:
                self._items.popleft()
                self._bytes -= len(item.payload)
                self.count_drop(item.run_id, item.pieces)
                continue
            if size + len(encoded) + 1 > max_bytes:
                break
            self._items.popleft()
            self._bytes -= len(item.payload)
            out.append((item, encoded))
            size += len(encoded) + 1
        return out

    def count_drop(self, run_id: str | None, n: int = 1) -> None:
        self.dropped += n
        if run_id is not None:
            self._dropped_by_run[run_id] = self._dropped_by_run.get(run_id, 0) + n

    def drop_all(self) -> None:
        while self._items:
            item = self._items.popleft()
            self.count_drop(item.run_id, item.pieces)
        self._bytes = 0

    def dropped_for(self, run_id: str) -> int:
        return self._dropped_by_run.get(run_id, 0)

    def forget_run(self, run_id: str) -> None:
        self._dropped_by_run.pop(run_id, None)
