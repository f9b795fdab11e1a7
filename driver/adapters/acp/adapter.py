"""The `acp` runtime: we are the Agent Client Protocol client of an agent process.

The agent is `execution.acp.command` (argv) with `execution.acp.env` on top of the provider
environment. We speak ACP v1 (JSON-RPC 2.0, one JSON object per line) over its stdin/stdout:
`initialize` → (`authenticate` when asked) → `session/new` or `session/load` → one `session/prompt`
per run, streaming `session/update` notifications that `AcpTurn` maps onto our events.

The agent calls us back for permissions, files and terminals; each incoming request runs in its own
task (the JSON-RPC peer does that), so a permission waiting for a human never stalls the stream.

Permission policy. ACP has no standard "never ask" switch; agents expose session modes instead. We
pick a mode by well-known id (see acp_session.wanted_mode; `provider_options.mode` overrides). If a
`full_access` agent asks anyway, we allow by option kind without bothering the control plane.

Layers: `acp_client.AcpClient` (the agent process, its peer, calls and file reports) ←
`acp_opening.AcpSessionOpener` (initialize, auth, session/new or session/load) ← `AcpAdapter` here
(turns, cancellation, the agent's callbacks); `acp_prompt` builds a turn's prompt and outcome.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any, ClassVar

import anyio
import msgspec

from driver import logs, tasks
from driver.adapters.acp import fs as acp_fs
from driver.adapters.acp import models as m
from driver.adapters.acp import permissions as acp_permissions
from driver.adapters.acp import prompt as acp_prompt
from driver.adapters.acp import state as acp_state
from driver.adapters.acp.followup import FollowUp, FollowUps, deliver_all
from driver.adapters.acp.followup import blocks_of as follow_up_blocks
from driver.adapters.acp.resume import CANCEL_RESEND_INTERVAL, CANCEL_RESENDS, AcpResumer
from driver.adapters.acp.terminal import TerminalError
from driver.adapters.acp.turn import AcpTurn
from driver.adapters.common.base import PermissionDecision, ProviderError, SteerRefused, TurnOutcome
from driver.adapters.common.jsonrpc import JsonRpcError, PeerClosed
from driver.protocol.capabilities import BY_RUNTIME
from driver.protocol.commands import RunInput
from driver.telemetry import tracing

log = logs.get(__name__)


class AcpAdapter(AcpResumer):
    runtime: ClassVar[str] = "acp"
    # Declared once, in driver/protocol/capabilities.py, so `hello` can state them without importing this module.
    capabilities: ClassVar[frozenset[str]] = BY_RUNTIME["acp"]

    # ---- one turn ---------------------------------------------------------------------------

    async def run(self, run_id: str, run_input: RunInput) -> TurnOutcome:
        if self._session_id is None or self._peer is None:
            raise ProviderError("provider.not_started", "the acp agent has no open session")
        if self._turn is not None:
            raise ProviderError("driver.run_active", "a turn is already running", retryable=True)
        prompt = self._prompt_blocks(run_input)  # first: an attachment it refuses changes nothing
        turn = AcpTurn(run_id, self._cost_total)
        follow_ups = self._begin(turn)
        self._mark(run_id)  # PROTOCOL §8.2: before the prompt is written
        try:
            return await self._prompts(turn, follow_ups, prompt, [])
        finally:
            self._end(turn, follow_ups)

    def _begin(self, turn: AcpTurn) -> FollowUps:
        self._turn = turn
        self._cancel_requested = False
        self._cancel_event = anyio.Event()
        self._reported_files = set()
        self._terminal_streams.reset()
        follow_ups = FollowUps()
        self._follow_ups = follow_ups
        return follow_ups

    async def _prompts(
        self, turn: AcpTurn, follow_ups: FollowUps, prompt: list[dict[str, Any]], batch: list[FollowUp]
    ) -> TurnOutcome:
        """session/prompt until no steer is held (`batch`: the steers `prompt` carries)."""
        while True:
            try:
                sent = functools.partial(deliver_all, batch) if batch else None
                raw = await self._prompt(prompt, sent)
            except JsonRpcError as exc:
                await self._emit_all(turn.finish("cancelled" if self._cancel_requested else "failed"))
                return self._refused(turn, exc)
            except ProviderError:
                await self._emit_all(turn.finish("failed"))
                raise
            self._recovery_pending = []
            self._instructions_pending = ""
            stop = await self._prompt_ended(turn, self._decode(raw, m.PromptResult, "session/prompt"))
            # PROTOCOL §3.1 follow_up: steers held while this prompt ran make one more turn of
            # the same run (none after a cancel: the cancel wins).
            batch = follow_ups.take() if stop != "cancelled" else []
            if not batch:
                return acp_prompt.outcome(turn, stop)
            prompt = follow_up_blocks(batch)

    async def _prompt_ended(self, turn: AcpTurn, result: m.PromptResult) -> str:
        """A prompt's answer: its usage, its stop reason; what is open is closed."""
        if result.usage is not None:
            await self._emit_all(turn.prompt_usage(result.usage))
        stop = "cancelled" if self._cancel_requested else result.stop_reason
        if stop == "cancelled" and not self._cancel_requested and turn.declined:
            # codex-acp's only reject option ("abort") ends the whole turn as cancelled. Nobody
            # cancelled the run: it ended because the user said no, which is a normal end.
            stop = "permission_rejected"
        await self._emit_all(turn.finish(stop))
        return stop

    def _refused(self, turn: AcpTurn, exc: JsonRpcError) -> TurnOutcome:
        if self._cancel_requested:
            return acp_prompt.outcome(turn, "cancelled")
        return TurnOutcome(
            status="failed",
            stop_reason="error",
            final_message_id=turn.final_message_id,
            final_message_text=turn.final_message_text,
            error_code="provider.error",
            error_message=f"session/prompt failed: {exc.message}",
            error_details={"code": exc.code},
        )

    def _end(self, turn: AcpTurn, follow_ups: FollowUps) -> None:
        ended = "cancelled" if self._cancel_requested else "run.not_active"
        follow_ups.close(SteerRefused(ended, "the run ended before the input reached the agent"))
        self._turn = None
        self._cost_total = turn.cost_total
        if turn.unknown_updates:
            for variant, count in turn.unknown_updates.items():
                self.unknown_updates[variant] = self.unknown_updates.get(variant, 0) + count
            log.info("acp.unknown_updates", counts=dict(turn.unknown_updates))

    async def steer(self, run_id: str, run_input: RunInput) -> None:
        """Mode `follow_up` (see driver/adapters/acp/followup.py): held until the current prompt ends."""
        turn, follow_ups = self._turn, self._follow_ups
        if turn is None or follow_ups is None or turn.run_id != run_id:
            raise SteerRefused("run.not_active", "no acp turn is running for this run")
        if self._cancel_requested:
            raise SteerRefused("cancelled", "the run was cancelled before the input reached the agent")
        assert self.agent is not None
        blocks = acp_prompt.prompt_blocks(run_input, cwd=self._cwd, agent=self.agent, instructions="", recovery=[])
        await follow_ups.add(blocks).wait()

    async def _prompt(self, prompt: list[dict[str, Any]], on_sent: Callable[[], None] | None = None) -> Any:
        """session/prompt, re-sending session/cancel while a requested cancel has not ended it.

        A cancel can be written before the prompt itself (both are queued on the same pipe, and the
        prompt's writer task may not have run yet); the agent then ignores it as a cancel of nothing
        and runs the whole turn. Re-sending it (a notification, harmless when repeated) closes that gap.
        """
        answer: dict[str, Any] = {}
        async with tasks.within("acp prompt") as tg:

            async def nudge() -> None:
                await self._cancel_event.wait()
                for _ in range(CANCEL_RESENDS):
                    await anyio.sleep(CANCEL_RESEND_INTERVAL)
                    await self._send_cancel()

            tg.spawn(nudge)
            try:
                params: dict[str, Any] = {"sessionId": self._session_id, "prompt": prompt}
                if traceparent := tracing.run_traceparent():
                    params["_meta"] = {"traceparent": traceparent}  # ACP's reserved trace context key
                answer["result"] = await self._call("session/prompt", params, on_sent)
            except (JsonRpcError, ProviderError) as exc:
                answer["error"] = exc
            tg.cancel_scope.cancel()
        if "error" in answer:
            raise answer["error"]
        return answer["result"]

    def _prompt_blocks(self, run_input: RunInput) -> list[dict[str, Any]]:
        assert self.agent is not None
        return acp_prompt.prompt_blocks(
            run_input,
            cwd=self._cwd,
            agent=self.agent,
            instructions=self._instructions_pending,
            recovery=self._recovery_pending,
        )

    async def cancel(self) -> None:
        if self._turn is None:
            return
        self._cancel_requested = True
        self._turn.cancelling = True
        self._cancel_event.set()
        if self._follow_ups is not None:  # a cancel wins over steers not yet delivered
            self._follow_ups.close(
                SteerRefused("cancelled", "the run was cancelled before the input reached the agent")
            )
        for scope in list(self._permission_scopes):
            scope.cancel()
        await self._send_cancel()

    async def _send_cancel(self) -> None:
        if self._peer is not None and self._session_id is not None:
            with contextlib.suppress(PeerClosed):
                await self._peer.notify("session/cancel", {"sessionId": self._session_id})

    # ---- agent → client ---------------------------------------------------------------------

    async def _on_notification(self, method: str, params: Any) -> None:
        if method != "session/update":
            log.debug("acp.notification_ignored", method=method)
            return
        try:
            note = m.decode(params, m.SessionNotification)
        except msgspec.ValidationError as exc:
            log.warning("acp.bad_update", error=str(exc))
            return
        if note.session_id != self._session_id:
            return  # history replayed by session/load (its id is set once loaded), or another session's
        if note.update.get("sessionUpdate") in acp_state.STATE_UPDATES:
            # The session's mode, options and commands change between turns too: not run-scoped.
            await self._emit_state(self._state.feed(note.update))
            return
        turn = self._turn
        if turn is None:
            return  # late updates after the turn ended
        await self._emit_all(turn.feed(note.update))
        if turn.new_terminals and self._terminals is not None:
            await self._terminal_streams.link(turn, self._terminals)

    async def _on_request(self, method: str, params: Any) -> Any:
        if method == "session/request_permission":
            return await self._request_permission(self._decode_params(params, m.RequestPermissionParams))
        if method == "fs/read_text_file":
            content = await acp_fs.read_text_file(self.ports.files, self._decode_params(params, m.ReadTextFileParams))
            return {"content": content}
        if method == "fs/write_text_file":
            written = await acp_fs.write_text_file(self.ports.files, self._decode_params(params, m.WriteTextFileParams))
            await self._file_changed(written.path, "created" if written.created else "modified", written.sha256)
            return {}
        if method.startswith("terminal/"):
            return await self._terminal(method, params)
        raise JsonRpcError(m.METHOD_NOT_FOUND, f"method not found: {method}")

    async def _request_permission(self, req: m.RequestPermissionParams) -> dict[str, Any]:
        call = req.tool_call
        turn = self._turn
        if turn is None or self._cancel_requested:
            return acp_permissions.CANCELLED
        await self._emit_all(turn.announce_tool(call))
        options = acp_permissions.offered(req.options)
        if self.config.execution.permission_policy == "full_access":
            chosen = acp_permissions.pick(options, acp_permissions.ALLOW_KINDS)
            log.info("acp.permission_auto_allowed", tool_call_id=call.tool_call_id, allowed=chosen is not None)
            return acp_permissions.selected(chosen)
        decision: PermissionDecision | None = None
        with anyio.CancelScope() as scope:
            self._permission_scopes.add(scope)
            try:
                decision = await self.ports.permissions.request(acp_permissions.to_request(call, options))
            finally:
                self._permission_scopes.discard(scope)
        if decision is None or self._cancel_requested:
            return acp_permissions.CANCELLED
        outcome, rejected = acp_permissions.answer(options, decision)
        if rejected:
            await self._emit_all(turn.decline_tool(call.tool_call_id))
        return outcome

    async def _terminal(self, method: str, params: Any) -> Any:
        terminals = self._terminals
        if terminals is None:
            raise JsonRpcError(m.INTERNAL_ERROR, "terminals are not available (agent stopping)")
        try:
            if method == "terminal/create":
                p = self._decode_params(params, m.CreateTerminalParams)
                cwd = acp_fs.admit(self.ports.files, p.cwd) if p.cwd else None
                terminal_id = await terminals.create(
                    p.command,
                    p.args,
                    env={e.name: e.value for e in p.env},
                    cwd=cwd,
                    output_byte_limit=p.output_byte_limit,
                )
                return {"terminalId": terminal_id}
            t = self._decode_params(params, m.TerminalParams)
            if method == "terminal/output":
                return terminals.output(t.terminal_id)
            if method == "terminal/wait_for_exit":
                return await terminals.wait_for_exit(t.terminal_id)
            if method == "terminal/kill":
                terminals.kill(t.terminal_id)
                return {}
            if method == "terminal/release":
                await terminals.release(t.terminal_id)
                return {}
        except TerminalError as exc:
            raise JsonRpcError(m.INVALID_PARAMS, str(exc)) from None
        raise JsonRpcError(m.METHOD_NOT_FOUND, f"method not found: {method}")
