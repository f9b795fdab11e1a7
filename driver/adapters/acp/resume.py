"""An ACP run continued after a driver restart (PROTOCOL §8.2; what is carried is in acp_reattach).

The successor's adapter re-reads the agent's output from the turn's start through a fresh `AcpTurn`
(the kernel's replay gate drops the events the predecessor journaled). The answers to the
predecessor's `session/prompt` requests (their ids adopted by the JSON-RPC peer) end the run's turns,
inline in the read loop as in the stream's order; requests the predecessor answered derive again what
answering them derived, and are not answered twice; those it left unanswered are answered here, by
the usual handlers. The turn mechanics (`_begin`, `_prompts`, ...) are `acp.AcpAdapter`'s.
"""

from __future__ import annotations

import abc
import functools
import hashlib
from typing import Any

import anyio
import msgspec

from driver import tasks
from driver.adapters.acp import fs as acp_fs
from driver.adapters.acp import models as m
from driver.adapters.acp import prompt as acp_prompt
from driver.adapters.acp import reattach as acp_reattach
from driver.adapters.acp.followup import FollowUp, FollowUps
from driver.adapters.acp.followup import blocks_of as follow_up_blocks
from driver.adapters.acp.opening import AcpSessionOpener
from driver.adapters.acp.turn import AcpTurn
from driver.adapters.common.base import ProviderError, TurnOutcome
from driver.adapters.common.jsonrpc import JsonRpcError, RequestId

CANCEL_RESENDS = 3
CANCEL_RESEND_INTERVAL = 1.0  # seconds; the kernel escalates to signals after 5 s


class AcpResumer(AcpSessionOpener):
    _follow_ups: FollowUps | None = None  # the steers held for the running run (PROTOCOL §3.1)

    @abc.abstractmethod
    def _begin(self, turn: AcpTurn) -> FollowUps:
        """Make `turn` the running one; its steers are held in the FollowUps returned."""

    @abc.abstractmethod
    async def _prompts(
        self, turn: AcpTurn, follow_ups: FollowUps, prompt: list[dict[str, Any]], batch: list[FollowUp]
    ) -> TurnOutcome:
        """session/prompt until no steer is held."""

    @abc.abstractmethod
    async def _prompt_ended(self, turn: AcpTurn, result: m.PromptResult) -> str:
        """A prompt's answer: returns its stop reason."""

    @abc.abstractmethod
    def _refused(self, turn: AcpTurn, exc: JsonRpcError) -> TurnOutcome:
        """The outcome of a refused session/prompt."""

    @abc.abstractmethod
    def _end(self, turn: AcpTurn, follow_ups: FollowUps) -> None:
        """The run's turn is over."""

    @abc.abstractmethod
    async def _send_cancel(self) -> None:
        """session/cancel for the open session."""

    def _continue(self, cont: acp_reattach.Continuation) -> None:
        super()._continue(cont)
        if cont.run_id is None or self._peer is None:
            return
        # The run's turn is re-derived from its start (a fresh translator: the kernel's gate drops what
        # was journaled); the answers to the predecessor's prompts end its turns.
        self._begin(AcpTurn(cont.run_id, cont.cost_before))
        for prompt_id in cont.prompt_ids:
            self._peer.adopt(prompt_id, functools.partial(self._adopted_answer, cont, prompt_id))

    async def _adopted_answer(self, cont: acp_reattach.Continuation, prompt_id: int, message: dict[str, Any]) -> None:
        """Inline in the read loop, like the notifications around it, so a replay derives the same
        events in the same order as the predecessor did."""
        turn = self._turn
        if turn is None or turn.run_id != cont.run_id or cont.done.is_set():
            return
        error = message.get("error")
        if error is not None:
            code = error.get("code") if isinstance(error, dict) else None
            text = str(error.get("message", "")) if isinstance(error, dict) else str(error)
            await self._emit_all(turn.finish("cancelled" if self._cancel_requested else "failed"))
            cont.outcome = self._refused(turn, JsonRpcError(code if isinstance(code, int) else m.INTERNAL_ERROR, text))
            cont.done.set()
            return
        try:
            result = self._decode(message.get("result"), m.PromptResult, "session/prompt")
        except ProviderError as exc:
            await self._emit_all(turn.finish("failed"))
            cont.error = exc
            cont.done.set()
            return
        stop = await self._prompt_ended(turn, result)
        if prompt_id == cont.prompt_ids[-1]:
            cont.stop = stop
            cont.done.set()

    async def resume(self, run_id: str) -> TurnOutcome:
        """Continue the run a dead driver left in flight: its output is being re-read from the turn's
        start; it ends when the agent answers the predecessor's last `session/prompt`, or after the
        steers held meanwhile make one more prompt (as in `run`)."""
        cont, turn, follow_ups = self._continuing, self._turn, self._follow_ups
        if cont is None or turn is None or follow_ups is None or turn.run_id != run_id:
            return await super().resume(run_id)
        try:
            if not cont.prompt_ids:
                raise ProviderError(
                    "driver.restarted", "the driver process died before it sent the run's prompt", retryable=True
                )
            await self._until_answered(cont, turn)
            if cont.error is not None:
                raise cont.error
            if cont.outcome is not None:
                return cont.outcome
            stop = cont.stop or "end_turn"
            batch = follow_ups.take() if stop != "cancelled" else []
            if not batch:
                return acp_prompt.outcome(turn, stop)
            return await self._prompts(turn, follow_ups, follow_up_blocks(batch), batch)
        finally:
            self._continuing = None
            self._end(turn, follow_ups)

    async def _until_answered(self, cont: acp_reattach.Continuation, turn: AcpTurn) -> None:
        """Until the adopted prompt is answered; `provider.crashed` when the agent goes away first.
        A cancel asked meanwhile is re-sent as in `_prompt`."""
        peer, proc = self._peer, self._proc
        if peer is None or proc is None:
            raise ProviderError("provider.not_started", "the acp agent is not running")
        async with tasks.within("acp adopted prompt") as tg:

            async def answered() -> None:
                await cont.done.wait()
                tg.cancel_scope.cancel()

            async def closed() -> None:
                await peer.closed.wait()
                tg.cancel_scope.cancel()

            async def exited() -> None:
                await proc.exited.wait()
                with anyio.move_on_after(2.0):  # the last lines (perhaps the answer) are read first
                    await peer.closed.wait()
                tg.cancel_scope.cancel()

            async def nudge() -> None:
                await self._cancel_event.wait()
                for _ in range(CANCEL_RESENDS):
                    await anyio.sleep(CANCEL_RESEND_INTERVAL)
                    await self._send_cancel()

            for task in (answered, closed, exited, nudge):
                tg.spawn(task)
        if cont.done.is_set():
            return
        await self._emit_all(turn.finish("failed"))
        code = None
        with anyio.move_on_after(2.0):
            code = await proc.wait()
        raise ProviderError(
            "provider.crashed",
            "the acp agent exited during the continued turn" + (f" (status {code})" if code is not None else ""),
            retryable=True,
            details={"stderr_tail": proc.stderr_tail(), "exit_code": code, "method": "session/prompt"},
        )

    async def _on_replayed(self, request_id: RequestId, method: str, params: Any) -> None:
        """A request the predecessor answered, met again in the re-read output: what answering it
        derived is derived again (the kernel's gate drops what was journaled); it is not answered."""
        turn, cont = self._turn, self._continuing
        if turn is None or cont is None:
            return
        reply = cont.replies.get(request_id)
        try:
            if method == "session/request_permission":
                req = m.decode(params, m.RequestPermissionParams)
                full_access = self.config.execution.permission_policy == "full_access"
                await self._emit_all(acp_reattach.replayed_permission(turn, req, reply, full_access=full_access))
            elif method == "fs/write_text_file" and reply is not None:
                write = m.decode(params, m.WriteTextFileParams)
                digest = hashlib.sha256(write.content.encode("utf-8")).hexdigest()
                # Whether it created the file is not in the log: a replay reports the change as a
                # modification (its place among the journaled events is what keeps it from being sent twice).
                await self._file_changed(acp_fs.admit(self.ports.files, write.path), "modified", digest)
        except (msgspec.ValidationError, JsonRpcError):
            return  # the predecessor refused it, and derived nothing
