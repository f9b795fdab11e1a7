"""Opening the ACP session: initialize, authentication, session/new or session/load, then modes,
model and config options. A failed session/load falls back to a new session plus the recovery
messages (PROTOCOL §8); the helpers without I/O are in acp_session."""

from __future__ import annotations

from typing import Any

from driver import logs
from driver.adapters.acp import models as m
from driver.adapters.acp import session as acp_session
from driver.adapters.acp import state as acp_state
from driver.adapters.acp.client import REFUSED, AcpClient
from driver.adapters.common.base import ProviderError
from driver.adapters.common.jsonrpc import JsonRpcError

log = logs.get(__name__)


class AcpSessionOpener(AcpClient):
    async def _open_session(self) -> None:
        init = await self._call(
            "initialize",
            {
                "protocolVersion": m.PROTOCOL_VERSION,
                "clientCapabilities": {"fs": {"readTextFile": True, "writeTextFile": True}, "terminal": True},
                "clientInfo": {"name": "agent-driver", "version": "0.1.0"},
            },
        )
        self.agent = self._decode(init, m.InitializeResult, "initialize")
        self._agent_raw = init
        if self.agent.protocol_version != m.PROTOCOL_VERSION:
            # The agent answered with the version it speaks; we support only ours (ACP v1).
            raise ProviderError(
                "provider.protocol",
                f"the acp agent speaks protocol version {self.agent.protocol_version}, not {m.PROTOCOL_VERSION}",
            )
        if self._host is not None and not self.agent.agent_capabilities.mcp_capabilities.http:
            await self._config_warning("the acp agent takes no MCP server over http: host_tools are not offered")
        resume = self.config.execution.native_resume
        if resume is not None:
            # A resume id of another runtime (the execution changed runtime) cannot be loaded either.
            loadable = resume.runtime == self.runtime and self.agent.agent_capabilities.load_session
            if loadable and await self._load_session(resume.value):
                return
            current = await self._new_session()
            log.info("acp.session_reset", previous=resume.value, current=current)
            self._recovery_pending = [(r.role, r.text) for r in self.config.execution.recovery_messages]
            await self.ports.emit("runtime.session.reset", {"previous": resume.value, "current": current})
        else:
            await self._new_session()
            # No session to load but a history to keep (PROTOCOL §8): replayed on the next turn.
            self._recovery_pending = [(r.role, r.text) for r in self.config.execution.recovery_messages]

    async def _config_warning(self, message: str) -> None:
        log.warning("acp.config", message=message)
        await self.ports.emit(
            "diagnostic.reported", {"code": "provider.config", "severity": "warning", "message": message}
        )

    def _session_params(self) -> dict[str, Any]:
        assert self.agent is not None
        host = acp_session.HostServer(self._host.url, self._host.token) if self._host is not None else None
        execution = self.config.execution
        return acp_session.session_params(
            self._cwd, self.config.session, execution, self.agent, host, self._setup_warnings
        )

    async def _report_setup_warnings(self) -> None:
        warnings, self._setup_warnings = self._setup_warnings, []
        for warning in dict.fromkeys(warnings):
            if warning not in self._warned:
                self._warned.add(warning)
                await self._config_warning(warning)

    def _claim_session(self, session_id: Any) -> None:
        """The session is the agent's from its answer on: called inline as the answer is read, so the
        updates the agent sends right after it (claude-agent-acp's slash commands) are not taken for
        another session's while the opener has not resumed yet."""
        if isinstance(session_id, str) and session_id != self._session_id:
            self._session_id = session_id
            self._state = acp_state.SessionState()
            self._cost_total = 0.0

    async def _new_session(self) -> str:
        params = self._session_params()

        def claim(raw: Any) -> None:
            self._claim_session(raw.get("sessionId") if isinstance(raw, dict) else None)

        try:
            raw = await self._call("session/new", params, on_answer=claim)
        except JsonRpcError as exc:
            if exc.code != m.AUTH_REQUIRED:
                raise ProviderError("provider.start_failed", f"session/new failed: {exc.message}") from None
            await self._authenticate()
            raw = await self._call("session/new", params, on_answer=claim)
        result = self._decode(raw, m.NewSessionResult, "session/new")
        if "systemPrompt" not in params:
            self._instructions_pending = acp_session.instruction_text(
                self._cwd, self.config.session, self.config.execution
            )
        await self._session_opened(result.session_id, result.modes, result.config_options, raw)
        await self._report_setup_warnings()
        return result.session_id

    async def _load_session(self, session_id: str) -> bool:
        # Updates replaying the history arrive before the answer; with no turn active they are dropped.
        try:
            raw = await self._call(
                "session/load",
                {**self._session_params(), "sessionId": session_id},
                on_answer=lambda _: self._claim_session(session_id),
            )
        except JsonRpcError as exc:
            log.info("acp.load_failed", session_id=session_id, code=exc.code, error=exc.message)
            return False
        result = self._decode(raw or {}, m.LoadSessionResult, "session/load")
        await self._session_opened(session_id, result.modes, result.config_options, raw)
        await self._report_setup_warnings()
        return True

    async def _session_opened(
        self, session_id: str, modes: m.SessionModeState | None, config_options: list[m.ConfigOption], raw: Any
    ) -> None:
        self._claim_session(session_id)  # a no-op: claimed as its answer was read (on_answer)
        await self.ports.emit("runtime.resume.updated", {"runtime": self.runtime, "value": session_id})
        await self._emit_all(self._state.opened(raw))
        await self._apply_mode(modes)
        await self._apply_model(config_options)
        options = self.config.execution.provider_options.get("config_options") or {}
        for config_id, value in dict(options).items():
            await self._set_config(config_id, value)

    async def _set_config(self, config_id: str, value: Any) -> None:
        assert self._session_id is not None
        answer = await self._try_call(
            "session/set_config_option", acp_state.set_config_params(self._session_id, config_id, value)
        )
        await self._emit_all(self._state.config(answer))

    async def _apply_model(self, config_options: list[m.ConfigOption]) -> None:
        choice = acp_session.model_choice(self.config.execution.model, config_options)
        if choice is None:
            if self.config.execution.model:
                log.info("acp.model_not_selectable", model=self.config.execution.model)
            return
        await self._set_config(*choice)

    async def _apply_mode(self, modes: m.SessionModeState | None) -> None:
        wanted = acp_session.wanted_mode(self.config.execution, modes)
        if wanted is not None:
            answer = await self._try_call("session/set_mode", {"sessionId": self._session_id, "modeId": wanted})
            if answer is not REFUSED:
                await self._emit_all(self._state.mode_set(wanted))

    async def _authenticate(self) -> None:
        assert self.agent is not None
        method = acp_session.env_auth_method(self.agent, self._env())
        if method is None:
            hint = acp_session.auth_hint(self.agent)
            raise ProviderError("provider.auth_required", f"the acp agent requires authentication: {hint}")
        try:
            await self._call("authenticate", {"methodId": method.id})
        except JsonRpcError as exc:
            raise ProviderError(
                "provider.auth_failed", f"authenticate with {method.id!r} failed: {exc.message}"
            ) from None

    async def reset(self) -> tuple[str | None, str | None]:
        previous = self._session_id
        current = await self._new_session()
        self._recovery_pending = []  # the discarded conversation is not replayed into the new one
        self._mark(None)
        return previous, current
