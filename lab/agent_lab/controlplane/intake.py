# mypy: disable-error-code="misc"
# (mypy allows a mixin's `self: ControlPlane` only for protocols; the annotation is what types these methods.)
"""Frames from a ready link: event batches validated and stored before their receipt is built (in
arrival order, pipelined), command updates, heartbeats; every fault knob acts here."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import msgspec
from websockets.exceptions import ConnectionClosed

from agent_lab.controlplane.faults import FAULT_REJECT_CODE
from agent_lab.controlplane.link import CLOSE_PROTOCOL, CLOSE_SUPERSEDED, CLOSE_TOO_BIG, Link
from agent_lab.controlplane.store_rows import BatchResult, StoredRejection, Superseded, now_iso
from agent_lab.controlplane.validation import InvalidEvent, ValidEvent, check_event
from driver import logs
from driver.protocol.frames import (
    CommandUpdate,
    EventsFrame,
    FrameError,
    Heartbeat,
    Hello,
    Receipt,
    Rejection,
    decode_driver_frame,
    encode,
)

log = logs.get("agent_driver.controlplane")

if TYPE_CHECKING:
    pass
if TYPE_CHECKING:
    from agent_lab.controlplane.server import ControlPlane


class EventIntake:
    """Mixed into `ControlPlane`: `_on_frame` for every frame after the handshake."""

    @staticmethod
    def _decode(raw: str | bytes) -> Hello | Heartbeat | CommandUpdate | EventsFrame | str:
        """The frame, or a string saying why it is a protocol violation."""
        if isinstance(raw, bytes):
            return "binary frames are not allowed"
        try:
            return decode_driver_frame(raw)
        except FrameError as exc:
            return f"bad frame: {exc}"

    async def _on_frame(self: ControlPlane, link: Link, raw: str | bytes) -> bool:
        """Handle one frame after the handshake; False when the link is being closed."""
        link.last_heard = asyncio.get_running_loop().time()
        if self.faults.too_big(len(raw)):
            self.refused_frames.append(len(raw))
            await self._close(link.ws, CLOSE_TOO_BIG, "message too big")
            return False
        frame = self._decode(raw)
        if isinstance(frame, str):
            await self._close(link.ws, CLOSE_PROTOCOL, frame[:120])
            return False
        frame_type = type(frame).__struct_config__.tag
        assert isinstance(frame_type, str)
        fault_close = self.faults.count_frame(frame_type)
        if fault_close is not None and fault_close[0] == "before_store":
            await self._close(link.ws, fault_close[1], "fault injected")
            return False
        if isinstance(frame, Hello):
            await self._close(link.ws, CLOSE_PROTOCOL, "hello after welcome")
            return False
        if isinstance(frame, EventsFrame):
            stored = await self._submit_batch(link, frame)
            if stored is None:
                return False
            if fault_close is None:
                # Keep reading while the write is on its way to disk: pipelined batches share a commit.
                link.receipts.put_nowait((frame.batch, stored))
                return True
            # A fault close acts at this very batch: answer every earlier one first, then this one
            # (or not), so "stored but not answered" is exact.
            await link.receipts.join()
            receipt = await self._receipt_for(link, frame.batch, stored)
            if fault_close[0] == "before_receipt":
                await self._close(link.ws, fault_close[1], "fault injected")
                return False
            await self._send_receipt(link, receipt)
        elif isinstance(frame, CommandUpdate):
            await self._record_update(link, frame)
        elif isinstance(frame, Heartbeat):
            beat = msgspec.to_builtins(frame)
            beat["received_at"] = now_iso()
            self._heartbeats[link.instance_id] = beat
            self._live.publish(link.instance_id, {"type": "heartbeat", **beat})
        if fault_close is not None:
            await self._close(link.ws, fault_close[1], "fault injected")
            return False
        return True

    async def _submit_batch(self: ControlPlane, link: Link, frame: EventsFrame) -> asyncio.Future[BatchResult] | None:
        """Validate a batch and queue its write; None when the batch is a protocol violation."""
        if len(frame.events) > self.max_batch_events:
            # Tolerated (the limit is advice to the driver), but worth a line when debugging a driver.
            log.warning("batch.over_limit", instance_id=link.instance_id, events=len(frame.events))
        admitted, fault_rejected = self.faults.admit([bytes(raw) for raw in frame.events])
        rejections: list[StoredRejection] = []
        for raw, retryable in fault_rejected:
            checked = check_event(raw)
            if checked.event_id is None:
                await self._close(link.ws, CLOSE_PROTOCOL, "event without a readable event_id")
                return None
            rejections.append(
                StoredRejection(
                    event_id=checked.event_id,
                    code=FAULT_REJECT_CODE,
                    message="rejected by fault injection",
                    retryable=retryable,
                )
            )
        valid: list[ValidEvent] = []
        for raw in admitted:
            checked = check_event(raw)
            if isinstance(checked, InvalidEvent):
                if checked.event_id is None:
                    await self._close(link.ws, CLOSE_PROTOCOL, "event without a readable event_id")
                    return None
                log.warning(
                    "event.invalid", instance_id=link.instance_id, event_id=checked.event_id, problem=checked.message
                )
                rejections.append(
                    StoredRejection(
                        event_id=checked.event_id, code="event.invalid", message=checked.message, retryable=False
                    )
                )
            else:
                valid.append(checked)
        return self.engine.insert_events(link.instance_id, link.generation, valid, rejections)

    async def _receipt_for(self: ControlPlane, link: Link, batch: int, stored: asyncio.Future[BatchResult]) -> bytes:
        """Wait for the batch's COMMIT, announce its new events, and build its receipt."""
        result = await stored
        if self._live.has_subscribers(link.instance_id):
            self._live.publish_many(link.instance_id, result.stored_items(link.instance_id))
        else:
            self._live.changed()
        receipt = Receipt(
            batch=batch,
            accepted=result.accepted,
            rejected=[
                Rejection(event_id=r.event_id, code=r.code, message=r.message, retryable=r.retryable)
                for r in result.rejected
            ],
        )
        return encode(receipt)

    async def _answer_batches(self: ControlPlane, link: Link) -> None:
        """Per link: send receipts in batch arrival order, each once its events are committed."""
        while True:
            batch, stored = await link.receipts.get()
            try:
                receipt = await self._receipt_for(link, batch, stored)
                await self._send_receipt(link, receipt)
            except ConnectionClosed:
                pass  # unanswered: the driver resends, and the duplicates are accepted again
            except Superseded:
                # A newer link claimed the instance (here or on another gateway): nothing of this batch
                # was stored and none will be; the newer link gets the resend.
                await self._close(link.ws, CLOSE_SUPERSEDED, "superseded by a newer connection")
            except Exception:
                log.exception("batch.store_failed", instance_id=link.instance_id, batch=batch)
                await self._close(link.ws, 1011, "store failure")
            finally:
                link.receipts.task_done()

    async def _send_receipt(self: ControlPlane, link: Link, receipt: bytes) -> None:
        sends, link.held_receipt = self.faults.plan_receipt(receipt, link.held_receipt)
        if not sends:
            return
        delay_ms = sends[0][0]
        frames = [f.decode() for _, f in sends]
        if delay_ms <= 0:
            for text in frames:
                await link.ws.send(text)
            return

        async def later() -> None:
            await asyncio.sleep(delay_ms / 1000)
            try:
                for text in frames:
                    await link.ws.send(text)
            except ConnectionClosed:
                pass

        link.spawn(later())

    async def _record_update(self: ControlPlane, link: Link, frame: CommandUpdate) -> None:
        error = None if frame.error is None else msgspec.to_builtins(frame.error)
        changed = await self.engine.record_update(
            link.instance_id, frame.command_id, frame.status, frame.result, error
        )
        if not changed:
            log.info("command.update.kept", command_id=frame.command_id, status=frame.status)
        self._live.publish(
            link.instance_id,
            {
                "type": "command.update",
                "command_id": frame.command_id,
                "status": frame.status,
                "result": frame.result,
                "error": error,
                "applied": changed,
            },
        )
