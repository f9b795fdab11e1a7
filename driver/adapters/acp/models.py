"""msgspec models of the Agent Client Protocol (v1) messages this client understands.

Tolerant readers: unknown fields are ignored and most fields have defaults, because agents add
`_meta`, unstable fields and whole new `sessionUpdate` variants between releases. What we decode
strictly is only what we act on (ids, statuses, stop reasons, paths). Field names are camelCase on
the wire (`rename="camel"`).
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

import msgspec

T = TypeVar("T")

PROTOCOL_VERSION = 1

# JSON-RPC / ACP error codes (ACP schema `ErrorCode`).
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
AUTH_REQUIRED = -32000
RESOURCE_NOT_FOUND = -32002


class _M(msgspec.Struct, rename="camel", kw_only=True):
    pass


# ---- initialize -------------------------------------------------------------------------------


class McpCapabilities(_M):
    http: bool = False
    sse: bool = False


class SessionCapabilities(_M):
    # Each capability is advertised as an (empty) object when supported, absent or null otherwise.
    additional_directories: dict[str, Any] | None = None
    resume: dict[str, Any] | None = None
    system_prompt: dict[str, Any] | None = None  # unstable: `systemPrompt` on session/new and load


class PromptCapabilities(_M):
    # Text and resource links are always accepted (ACP baseline); these are opt-in.
    image: bool = False
    audio: bool = False
    embedded_context: bool = False


class AgentCapabilities(_M):
    load_session: bool = False
    prompt_capabilities: PromptCapabilities = msgspec.field(default_factory=PromptCapabilities)
    mcp_capabilities: McpCapabilities = msgspec.field(default_factory=McpCapabilities)
    session_capabilities: SessionCapabilities = msgspec.field(default_factory=SessionCapabilities)


class AuthEnvVar(_M):
    name: str


class AuthMethod(_M):
    """`type` absent means "agent"; "env_var" (codex-acp) lists the variables it reads."""

    id: str
    name: str = ""
    type: str = "agent"
    vars: list[AuthEnvVar] = msgspec.field(default_factory=list)


class Implementation(_M):
    name: str = ""
    version: str = ""


class InitializeResult(_M):
    protocol_version: int
    agent_capabilities: AgentCapabilities = msgspec.field(default_factory=AgentCapabilities)
    auth_methods: list[AuthMethod] = msgspec.field(default_factory=list)
    agent_info: Implementation | None = None


# ---- sessions ---------------------------------------------------------------------------------


class SessionMode(_M):
    id: str
    name: str = ""


class SessionModeState(_M):
    current_mode_id: str
    available_modes: list[SessionMode] = msgspec.field(default_factory=list)


class ConfigOption(_M):
    """A session configuration selector (`configOptions`): the model, the mode, an effort level...

    `options` is a flat list of `{value, name}` or a list of groups each holding such a list; it is
    kept raw and flattened by `values()`.
    """

    id: str
    category: str | None = None
    current_value: Any = None
    options: list[dict[str, Any]] = msgspec.field(default_factory=list)

    def values(self) -> list[Any]:
        out: list[Any] = []
        for option in self.options:
            if "value" in option:
                out.append(option["value"])
            for inner in option.get("options") or []:
                if isinstance(inner, dict) and "value" in inner:
                    out.append(inner["value"])
        return out


class NewSessionResult(_M):
    session_id: str
    modes: SessionModeState | None = None
    config_options: list[ConfigOption] = msgspec.field(default_factory=list)


class LoadSessionResult(_M):
    modes: SessionModeState | None = None
    config_options: list[ConfigOption] = msgspec.field(default_factory=list)


StopReason = Literal["end_turn", "max_tokens", "max_turn_requests", "refusal", "cancelled"]


class PromptUsage(_M):
    """Unstable `PromptResponse.usage` (some agents send it; totals across the session)."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    thought_tokens: int | None = None
    cached_read_tokens: int | None = None


class PromptResult(_M):
    stop_reason: str
    usage: PromptUsage | None = None


# ---- session/update ---------------------------------------------------------------------------


class ContentBlock(_M):
    type: str
    text: str | None = None


class ContentChunk(_M):
    content: ContentBlock
    message_id: str | None = None


ToolStatus = Literal["pending", "in_progress", "completed", "failed"]


class ToolCallContent(_M):
    """`content` (a block), `diff` (path, old/new text) or `terminal` (an id from terminal/create)."""

    type: str
    content: ContentBlock | None = None
    path: str | None = None
    old_text: str | None = None
    new_text: str | None = None
    terminal_id: str | None = None


class ToolCall(_M):
    tool_call_id: str
    title: str = ""
    name: str | None = None  # the agent's own tool name (claude-agent-acp: "Write", "Bash")
    kind: str | None = None
    status: str | None = None
    content: list[ToolCallContent] | None = None
    raw_input: Any = None
    raw_output: Any = None


class PlanEntry(_M):
    content: str
    status: str = "pending"


class Plan(_M):
    entries: list[PlanEntry]


class Cost(_M):
    amount: float
    currency: str = "USD"


class UsageUpdate(_M):
    """`usage_update`: context window fill (`used` of `size` tokens) and, optionally, cost."""

    used: int | None = None
    size: int | None = None
    cost: Cost | None = None


class SessionNotification(_M):
    session_id: str
    update: dict[str, Any]


# ---- client methods (agent → client) ----------------------------------------------------------


class PermissionOption(_M):
    option_id: str
    kind: str
    name: str = ""


class RequestPermissionParams(_M):
    session_id: str
    tool_call: ToolCall
    options: list[PermissionOption]


class ReadTextFileParams(_M):
    session_id: str
    path: str
    line: int | None = None
    limit: int | None = None


class WriteTextFileParams(_M):
    session_id: str
    path: str
    content: str


class EnvVariable(_M):
    name: str
    value: str


class CreateTerminalParams(_M):
    session_id: str
    command: str
    args: list[str] = msgspec.field(default_factory=list)
    env: list[EnvVariable] = msgspec.field(default_factory=list)
    cwd: str | None = None
    output_byte_limit: int | None = None


class TerminalParams(_M):
    session_id: str
    terminal_id: str


def decode(value: Any, type_: type[T]) -> T:
    """Convert a parsed JSON value into `type_`; msgspec.ValidationError names the bad field."""
    return msgspec.convert(value, type_)
