"""What the console serves and to whom (no I/O)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from driver.net.link import is_loopback as is_loopback  # one loopback rule, the driver's (re-exported)


@dataclass(frozen=True)
class ConsoleConfig:
    """`token` is asked of every console request (cookie or bearer). On a non-loopback `host` it is asked
    of EVERY request on the port, the JSON API and health included. `artifact_roots` maps an instance id
    to its driver's `cwd` as this machine sees it: the protocol carries no file content, so the console
    can offer an artifact for download only where it can read the sandbox's files (and only while the
    file still has the reported sha256). Uploaded attachments are kept under `uploads_dir`."""

    token: str
    host: str = "127.0.0.1"
    artifact_roots: dict[str, Path] = field(default_factory=dict)
    uploads_dir: Path | None = None

    def __post_init__(self) -> None:
        if not self.token:
            raise ValueError("the console token must not be empty")
        # It travels in a cookie: only characters a cookie value holds unquoted.
        if any(not (33 <= ord(c) <= 126) or c in ';,"\\' for c in self.token):
            raise ValueError("the console token may hold only printable ASCII without spaces, ';', ',', '\"' or '\\'")

    @property
    def gate_everything(self) -> bool:
        return not is_loopback(self.host)
