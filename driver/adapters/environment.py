"""The environment a provider process gets: an allowlist of the driver's own plus the execution's.

Nothing else of the driver's environment is passed on, so the control token (which the driver never
puts in its environment anyway), the boot-file variable and unrelated secrets cannot reach a child.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

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


def provider_env(
    execution_env: Mapping[str, str],
    *,
    home: str,
    traceparent: str | None = None,
    parent: Mapping[str, str] | None = None,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Build a provider's environment. `extra` (adapter-specific settings) wins over the rest."""
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
