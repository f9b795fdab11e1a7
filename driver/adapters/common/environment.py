"""Every child's environment: an allowlist of the driver's own plus the execution's, and no secret
under any name.

Nothing else of the driver's environment is passed on, so the control token (which the driver never
puts in its environment anyway), the boot-file variable and unrelated secrets cannot reach a child.

`child_env` is the one function every child's environment goes through last (the provider, an ACP
agent and its `env`, the MCP stdio servers' `env`, `process.start`, the keeper's provider): it drops
the driver's own variables by name and every WITHHELD value whatever its name (PROTOCOL §6.7, §9,
THREATS 9: withholding `ANTHROPIC_API_KEY` by name misses the same key under `OTHER`). The withheld
values are the §6.7 secrets (`execution.model_proxy.secrets`, when the proxy is on) and the control
token; the kernel registers them once at boot (`withhold`), so a spawn site deep in an adapter cannot
forget them. A value equal to one is dropped, and so is a value that holds one of at least
`CONTAINED_MIN` characters (`Bearer <key>`); shorter ones only by equality, so a short token cannot
knock out `PATH`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import msgspec

from driver import logs

if TYPE_CHECKING:
    from driver.protocol.boot import BootPayload, ExecutionConfig

log = logs.get("driver.adapters.environment")

# Variables a provider legitimately needs from the sandbox: locale, paths, proxies, TLS roots.
PASSTHROUGH: frozenset[str] = frozenset(
    {
        "PATH",
        "LANG",
        "LC_ALL",
        "LC_CTYPE",
        "TZ",
        "TMPDIR",
        "TERM",
        "USER",
        "LOGNAME",
        "SHELL",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
        "http_proxy",
        "https_proxy",
        "no_proxy",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "NODE_EXTRA_CA_CERTS",
    }
)
# Never forwarded, even if a caller lists them in execution.environment by mistake.
FORBIDDEN: frozenset[str] = frozenset({"AGENT_DRIVER_BOOT_FILE", "AGENT_DRIVER_CONTROL_TOKEN"})
# A withheld value this long is also found inside another value; a shorter one only as the whole value.
CONTAINED_MIN = 8
# The values no child may see, registered once at boot (`withhold`): the §6.7 secrets, the token.
_WITHHELD: set[str] = set()


def withheld_of(boot: BootPayload) -> frozenset[str]:
    """The values no child of this driver may see: the control token and, with the model proxy on,
    each §6.7 secret (by its value in `execution.environment` or the ACP agent's `env`)."""
    execution = boot.execution
    values = {boot.control.token}
    if execution.model_proxy is not None:
        sources = [execution.environment, execution.acp.env if execution.acp else {}]
        values |= {src[name] for name in execution.model_proxy.secrets for src in sources if name in src}
    return frozenset(v for v in values if v)


def withhold(values: Iterable[str]) -> None:
    """Register values no child may see (the kernel, once at boot)."""
    _WITHHELD.update(v for v in values if v)


def _holds_withheld(value: str, withheld: Iterable[str]) -> bool:
    return any(value == w or (len(w) >= CONTAINED_MIN and w in value) for w in withheld)


def child_env(
    *layers: Mapping[str, str] | None,
    withheld: Iterable[str] = (),
    names: Iterable[str] = (),
) -> dict[str, str]:
    """THE environment of a child: `layers` merged in order (a later one wins), then every variable
    whose name is the driver's own (FORBIDDEN) or in `names`, and every one whose value is or holds a
    withheld value (the registered ones and `withheld`), removed. The names of removed variables are
    logged, never their values."""
    values = _WITHHELD | set(withheld)
    dropped_names = FORBIDDEN | set(names)
    env: dict[str, str] = {}
    for layer in layers:
        if layer:
            env.update(layer)
    out: dict[str, str] = {}
    removed: list[str] = []
    for key, value in env.items():
        if key in dropped_names:
            continue
        if values and _holds_withheld(value, values):
            removed.append(key)
            continue
        out[key] = value
    if removed:
        log.warning("env.withheld_by_value", variables=sorted(removed))
    return out


def withhold_execution(execution: ExecutionConfig) -> ExecutionConfig:
    """The execution snapshot an adapter gets, with the environments it hands on by itself (the ACP
    agent's `env`, each MCP stdio server's `env`, `environment`) passed through `child_env`."""
    changes: dict[str, object] = {"environment": child_env(execution.environment)}
    if execution.acp is not None:
        changes["acp"] = msgspec.structs.replace(execution.acp, env=child_env(execution.acp.env))
    changes["mcp_servers"] = [msgspec.structs.replace(s, env=child_env(s.env)) for s in execution.mcp_servers]
    return msgspec.structs.replace(execution, **changes)


def provider_env(
    execution_env: Mapping[str, str],
    *,
    home: str,
    traceparent: str | None = None,
    parent: Mapping[str, str] | None = None,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The layers of a provider's environment (`extra`, adapter-specific settings, wins over the rest).
    With the model proxy on, its secrets are still here, for the proxy to swap for placeholders
    (driver/model_proxy/plan.py); `child_env` then drops whatever withheld value is left."""
    source = os.environ if parent is None else parent
    env = {k: v for k, v in source.items() if k in PASSTHROUGH}
    env["HOME"] = home
    env.update(execution_env)
    if traceparent:
        env["TRACEPARENT"] = traceparent
    if extra:
        env.update(extra)
    for key in FORBIDDEN:
        env.pop(key, None)
    return env
