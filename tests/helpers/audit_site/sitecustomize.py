"""Test-only: with DRIVER_AUDIT_LOG set, record the file operations of this Python process (an audit
hook, `sys.addaudithook`) as JSON lines in that file, for tests/kernel/test_agent_folder_audit.py.

Put on PYTHONPATH of a driver process by that test alone; nothing of the driver imports it."""

from __future__ import annotations

import json
import os
import sys

_LOG = os.environ.get("DRIVER_AUDIT_LOG")
_EVENTS = {"open", "os.rename", "os.symlink", "os.mkdir", "os.remove", "os.link", "shutil.rmtree", "os.truncate"}


def _text(value: object) -> object:
    if isinstance(value, bytes | str) or hasattr(value, "__fspath__"):
        return os.fsdecode(os.fspath(value))  # type: ignore[arg-type]
    return value if isinstance(value, int | None) else repr(value)


if _LOG:
    _fd = os.open(_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    _pid = os.getpid()

    def _hook(event: str, args: tuple[object, ...]) -> None:
        if event not in _EVENTS or os.getpid() != _pid:
            return
        os.write(_fd, (json.dumps({"event": event, "args": [_text(a) for a in args]}) + "\n").encode())

    sys.addaudithook(_hook)
