"""Schema of the one-time boot payload (PROTOCOL §1).

Strict: every field is typed and constrained, and unknown fields are refused, because a typo in a
sandbox's configuration should stop the driver with a clear line rather than be silently ignored.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

InstanceId = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:-]+$")]
NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]
Runtime = Literal["claude-agent-sdk", "openai-app-server", "acp"]
RUNTIMES: tuple[str, ...] = ("claude-agent-sdk", "openai-app-server", "acp")


# Every number of the payload has a stated range (PROTOCOL §9 "Every number the CP gives is clamped";
# docs/protocol.md §1): one outside it is refused at boot, naming the field (exit 78), never taken as is.
# A grace of a year, a timeout of 0, a budget past any bill: each is a mistake or an attack.
HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
IdleExitMs = Annotated[int, msgspec.Meta(ge=100, le=30 * DAY_MS)]  # 100 ms .. 30 days (null: never)
WaitMs = Annotated[int, msgspec.Meta(ge=1_000, le=DAY_MS)]  # a permission or host tool: 1 s .. 24 h
GraceMs = Annotated[int, msgspec.Meta(ge=0, le=HOUR_MS)]  # a kept provider waits 0 .. 1 h (§8.2)
RssMb = Annotated[float, msgspec.Meta(ge=16, le=1_048_576)]  # 16 MiB .. 1 TiB
Usd = Annotated[float, msgspec.Meta(ge=0, le=1_000_000)]
Tokens = Annotated[int, msgspec.Meta(ge=0, le=10**12)]
FileSize = Annotated[int, msgspec.Meta(ge=0, le=2**40)]  # a checkpoint file: at most 1 TiB
ACP_REQUIRED = "execution.acp is required when execution.runtime is 'acp'"
PROXY_SECRET_MISSING = "execution.model_proxy.secrets names a variable that is not in execution.environment"
PROXY_BAD_URL = (
    "with execution.model_proxy, ANTHROPIC_BASE_URL, OPENAI_BASE_URL and provider_options.base_url must be "
    "http(s) URLs"
)
OWN_MESSAGES = frozenset({ACP_REQUIRED, PROXY_SECRET_MISSING, PROXY_BAD_URL})


class _Strict(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class ControlConfig(_Strict):
    url: NonEmpty
    token: NonEmpty
    insecure_transport: bool = False
    ca_file: str | None = None


class SessionConfig(_Strict):
    id: NonEmpty
    agent_id: NonEmpty
    kind: Literal["cattle", "pet"]
    cwd: NonEmpty
    state_dir: NonEmpty
    memory_dir: str | None = None
    additional_directories: list[str] = msgspec.field(default_factory=list)
    idle_exit_ms: IdleExitMs | None = 300_000


class McpServer(_Strict):
    name: NonEmpty
    transport: Literal["http", "stdio"]
    url: str | None = None
    headers_from_env: dict[str, str] = msgspec.field(default_factory=dict)
    command: list[str] = msgspec.field(default_factory=list)
    env: dict[str, str] = msgspec.field(default_factory=dict)


class HostTool(_Strict):
    name: NonEmpty
    description: str = ""
    input_schema: dict[str, Any] = msgspec.field(default_factory=lambda: {"type": "object"})


class Skill(_Strict):
    name: NonEmpty
    archive_url: NonEmpty
    sha256: Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{64}$")]
    mount_path: NonEmpty


class AcpConfig(_Strict):
    command: Annotated[list[str], msgspec.Meta(min_length=1)]
    env: dict[str, str] = msgspec.field(default_factory=dict)


class NativeResume(_Strict):
    runtime: Runtime
    value: NonEmpty


class RecoveryMessage(_Strict):
    role: Literal["user", "assistant"]
    text: str


class Limits(_Strict):
    provider_rss_mb: RssMb | None = None


class Budget(_Strict):
    max_usd_per_run: Usd | None = None
    max_tokens_per_run: Tokens | None = None
    max_usd_per_session: Usd | None = None


class ModelProxy(_Strict):
    """§6.7: the variables of `execution.environment` withheld from the provider, and the budgets."""

    secrets: list[NonEmpty] = msgspec.field(default_factory=list)
    budget: Budget = msgspec.field(default_factory=Budget)


class CheckpointFile(_Strict):
    path: NonEmpty  # relative to the provider's home
    url: NonEmpty  # file: or http(s):
    size: FileSize
    sha256: Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{64}$")]


class NativeCheckpoint(_Strict):
    """§8.1: a provider-native session to restore in this (new) sandbox."""

    runtime: Runtime
    native_ref: NonEmpty
    files: list[CheckpointFile] = msgspec.field(default_factory=list)


class ExecutionConfig(_Strict):
    revision: NonEmpty
    runtime: Runtime
    model: str = ""
    system_prompt: str = ""
    permission_policy: Literal["full_access", "supervised"] = "supervised"
    permission_timeout_ms: WaitMs = 300_000
    environment: dict[str, str] = msgspec.field(default_factory=dict)
    mcp_servers: list[McpServer] = msgspec.field(default_factory=list)
    host_tools: list[HostTool] = msgspec.field(default_factory=list)
    skills: list[Skill] = msgspec.field(default_factory=list)
    provider_options: dict[str, Any] = msgspec.field(default_factory=dict)
    acp: AcpConfig | None = None
    native_resume: NativeResume | None = None
    recovery_messages: list[RecoveryMessage] = msgspec.field(default_factory=list)
    host_tool_timeout_ms: WaitMs = 600_000
    limits: Limits = msgspec.field(default_factory=Limits)
    model_proxy: ModelProxy | None = None
    native_checkpoint: NativeCheckpoint | None = None
    reattach_grace_ms: GraceMs = 0


class Telemetry(_Strict):
    otlp_endpoint: NonEmpty
    headers_from_env: dict[str, str] = msgspec.field(default_factory=dict)


class BootPayload(_Strict):
    protocol: Literal[1]
    driver_instance_id: InstanceId
    control: ControlConfig
    session: SessionConfig
    execution: ExecutionConfig
    traceparent: str | None = None
    telemetry: Telemetry | None = None

    def __post_init__(self) -> None:
        if self.execution.runtime == "acp" and self.execution.acp is None:
            raise ValueError(ACP_REQUIRED)
        proxy = self.execution.model_proxy
        if proxy is not None and any(name not in self.execution.environment for name in proxy.secrets):
            # A typo would leave the real key, under its real name, where the agent can read it.
            raise ValueError(PROXY_SECRET_MISSING)
        if proxy is not None and not _proxy_urls_ok(self.execution):
            raise ValueError(PROXY_BAD_URL)


def _proxy_urls_ok(execution: ExecutionConfig) -> bool:
    """The upstreams the model proxy forwards to must be URLs it can call (PROTOCOL §6.7)."""
    env = {**execution.environment, **(execution.acp.env if execution.acp else {})}
    urls: list[object] = [env.get("ANTHROPIC_BASE_URL"), env.get("OPENAI_BASE_URL")]
    if execution.runtime == "openai-app-server":
        urls.append(execution.provider_options.get("base_url"))
    for url in urls:
        if url is None or url == "":
            continue
        if not isinstance(url, str) or not url.startswith(("http://", "https://")) or len(url) <= len("https://"):
            return False
    return True


BOOT_DECODER = msgspec.json.Decoder(BootPayload)
