"""Fault knobs of the reference control plane, and the pure policy that applies them.

`Faults` is a mutable msgspec struct: tests set knobs in-process (`cp.faults.withhold_receipts = True`)
or over HTTP (`POST /api/faults`, validated by the same struct). The server asks it three questions at
three points and does what it answers; nothing else in the server knows about faults:

1. `admit(events)`     when an `events` frame arrives: which to store, which to reject, which to ignore;
2. `plan_receipt(...)` before a receipt goes out: what to send, when, how many times, in which order;
3. `count_frame(...)`  for every frame after `hello`: whether (and at which stage) to close the link.

One-shot knobs count down in place (`reject_next_events`, `close_after_frames`), so reading them back
shows what is still armed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal, TypeVar

import msgspec

CloseStage = Literal["before_store", "before_receipt", "after_receipt"]
FAULT_REJECT_CODE = "fault.injected"

T = TypeVar("T")


class Faults(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    # Store events but never answer their batch.
    withhold_receipts: bool = False
    # Send each receipt this many milliseconds late (frames keep flowing meanwhile).
    receipt_delay_ms: int = 0
    # Only the first K events of each batch are considered; the rest are in neither receipt list.
    partial_receipt_events: int | None = None
    # Send every receipt twice.
    duplicate_receipts: bool = False
    # Hold each receipt until the next one is ready, then send the newer one first.
    reorder_receipts: bool = False
    # Reject the next N events (one shot, counts down) with this `retryable` flag.
    reject_next_events: int = 0
    reject_retryable: bool = True
    # Close the link after N more frames (of `close_frame_type`, or any type when None), at `close_stage`.
    close_after_frames: int | None = None
    close_frame_type: str | None = None
    close_stage: CloseStage = "before_receipt"
    close_code: Annotated[int, msgspec.Meta(ge=1000, le=4999)] = 1011
    # Refuse every new link with 4401, as if the token were revoked.
    reject_auth: bool = False
    # Close with 1009 (message too big), storing nothing, on any frame larger than this many bytes.
    max_frame_bytes: Annotated[int, msgspec.Meta(ge=1)] | None = None

    def update(self, patch: dict[str, Any]) -> None:
        """Apply a partial settings dict, all-or-nothing; raises msgspec.ValidationError naming the knob."""
        merged = msgspec.convert({**msgspec.structs.asdict(self), **patch}, Faults)
        for name in self.__struct_fields__:
            setattr(self, name, getattr(merged, name))

    def reset(self) -> None:
        self.update(msgspec.structs.asdict(Faults()))

    def as_dict(self) -> dict[str, Any]:
        return msgspec.structs.asdict(self)

    # -- policy ---------------------------------------------------------------------------------

    def admit(self, events: Sequence[T]) -> tuple[list[T], list[tuple[T, bool]]]:
        """Split a batch into (to validate and store, to reject with the given `retryable`).

        Events past `partial_receipt_events` appear in neither list: the receipt leaves them out.
        """
        considered = list(events if self.partial_receipt_events is None else events[: self.partial_receipt_events])
        n_reject = min(self.reject_next_events, len(considered))
        self.reject_next_events -= n_reject
        rejected = [(e, self.reject_retryable) for e in considered[:n_reject]]
        return considered[n_reject:], rejected

    def plan_receipt(self, receipt: bytes, held: bytes | None) -> tuple[list[tuple[int, bytes]], bytes | None]:
        """Return ([(delay_ms, frame), ...] to send, the receipt to hold back for later)."""
        if self.withhold_receipts:
            return [], held
        if self.reorder_receipts and held is None:
            return [], receipt
        frames = [receipt] if held is None else [receipt, held]
        if self.duplicate_receipts:
            frames = [f for f in frames for _ in (0, 1)]
        return [(self.receipt_delay_ms, f) for f in frames], None

    def too_big(self, size: int) -> bool:
        """Whether a frame of `size` bytes is refused with 1009."""
        return self.max_frame_bytes is not None and size > self.max_frame_bytes

    def count_frame(self, frame_type: str) -> tuple[CloseStage, int] | None:
        """Count one inbound frame; when the countdown reaches zero, say where to close and how."""
        if self.close_after_frames is None:
            return None
        if self.close_frame_type is not None and frame_type != self.close_frame_type:
            return None
        self.close_after_frames -= 1
        if self.close_after_frames > 0:
            return None
        self.close_after_frames = None
        return self.close_stage, self.close_code
