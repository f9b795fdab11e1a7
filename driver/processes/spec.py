"""From a `process.start` to what is executed (PROTOCOL §6.8), free of I/O: the argv (the login shell
when empty), the environment (the provider's, never the driver's own, never a §6.7 secret, plus the
command's `env`), the signal table and how an exit status reads on the wire."""

from __future__ import annotations

import signal as _signal
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from driver.adapters.common.environment import FORBIDDEN, child_env

MAX_PROCESSES = 16  # running at once; one more fails `process.limit`
DEFAULT_TERM = "xterm-256color"  # what the console's xterm.js is

SIGNALS: dict[str, int] = {
    "TERM": _signal.SIGTERM,
    "KILL": _signal.SIGKILL,
    "INT": _signal.SIGINT,
    "HUP": _signal.SIGHUP,
}


class SpecError(ValueError):
    """A `process.start` that cannot be honoured; `code` is the command error's."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def argv_of(argv: list[str], env: Mapping[str, str], account_shell: str | None) -> list[str]:
    """`argv`, or the login shell when it is empty: $SHELL of the process's environment, else the
    account's shell, else /bin/sh."""
    for arg in argv:
        if "\0" in arg:
            raise SpecError("command.invalid", "argv: an argument contains a NUL character")
    if argv:
        if not argv[0]:
            raise SpecError("command.invalid", "argv[0] is empty")
        return list(argv)
    shell = env.get("SHELL") or account_shell or "/bin/sh"
    return [shell, "-l"]


def env_of(
    provider_env: Mapping[str, str],
    extra: Mapping[str, str],
    secrets: Iterable[str],
    *,
    pty: bool,
) -> dict[str, str]:
    """The provider's environment without the §6.7 secrets, plus `extra`. A key of `extra` that names
    a secret or a driver variable is refused: a process beside the agent is the agent's reach too."""
    withheld = set(secrets) | FORBIDDEN
    for key, value in extra.items():
        if not key or "=" in key or "\0" in key:
            raise SpecError("command.invalid", "env: a variable name is empty or holds '=' or NUL")
        if "\0" in value:
            raise SpecError("command.invalid", f"env: the value of {key} contains a NUL character")
        if key in withheld:
            raise SpecError("process.env_refused", f"env: {key} is withheld from processes in the sandbox")
    # By value too: a secret under another name, in the payload or in `extra`, is dropped (child_env).
    return child_env(provider_env, {"TERM": DEFAULT_TERM} if pty else None, extra, names=withheld)


class ExitInfo(NamedTuple):
    exit_code: int | None
    signal: str | None


def exit_info(returncode: int) -> ExitInfo:
    """subprocess's returncode (-N for a signal, as `containment.exit_status` reports it) as the
    wire's `exit_code` / `signal` pair: one of them is null."""
    if returncode < 0:
        try:
            name = _signal.Signals(-returncode).name.removeprefix("SIG")
        except ValueError:
            name = str(-returncode)
        return ExitInfo(None, name)
    return ExitInfo(returncode, None)
