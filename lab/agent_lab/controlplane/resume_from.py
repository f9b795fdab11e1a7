"""`agent-driver controlplane boot --resume-from INSTANCE` (PROTOCOL §8.1): the latest complete native
checkpoint of INSTANCE, fetched from the control plane's HTTP API, its files written (mode 0600, named
by sha256) into a folder the new driver reads, and `execution.native_checkpoint` naming them by `file:`
URLs. Each file is hash-checked here too, and again by the driver as it fetches it.
"""

from __future__ import annotations

import base64
import binascii
import os
import urllib.parse
from pathlib import Path
from typing import Any

from agent_lab.controlplane.checkpoints import native_checkpoint


class ResumeError(Exception):
    pass


def latest_checkpoint(base: str, token: str, instance: str) -> dict[str, Any]:
    from agent_lab.controlplane.cli import _call

    path = "/api/instances/" + urllib.parse.quote(instance, safe="")
    status, body = _call(base.rstrip("/"), token, "GET", path + "/checkpoints")
    if status == 0:
        raise ResumeError(f"{body['error']}: --resume-from needs the control plane's HTTP API (--url)")
    if status in (401, 403):
        raise ResumeError(f"the control plane's token does not allow reading instance {instance!r}")
    if status != 200 or not isinstance(body, dict) or not isinstance(body.get("checkpoints"), list):
        raise ResumeError(f"unexpected answer from {base} (HTTP {status}) for the checkpoints of {instance!r}")
    if not body["checkpoints"]:
        raise ResumeError(f"instance {instance!r} has no complete checkpoint")
    latest: dict[str, Any] = body["checkpoints"][-1]
    return latest


def fetch_blob(base: str, token: str, instance: str, sha256: str) -> bytes | None:
    from agent_lab.controlplane.cli import _call

    path = "/api/instances/" + urllib.parse.quote(instance, safe="")
    status, body = _call(base.rstrip("/"), token, "GET", f"{path}/checkpoint-file?sha256={sha256}")
    if status != 200 or not isinstance(body, dict) or not isinstance(body.get("data_b64"), str):
        return None
    try:
        return base64.b64decode(body["data_b64"], validate=True)
    except (binascii.Error, ValueError):
        return None


def resume_from(
    base: str, token: str, instance: str, runtime: str, folder: Path, owner: tuple[int, int] | None = None
) -> dict[str, Any]:
    """`execution.native_checkpoint` for a driver of `runtime`, from INSTANCE's latest checkpoint."""
    latest = latest_checkpoint(base, token, instance)
    if latest["runtime"] != runtime:
        raise ResumeError(f"the latest checkpoint of {instance!r} is of runtime {latest['runtime']}, not {runtime}")
    try:
        checkpoint = native_checkpoint(latest, folder, lambda sha: fetch_blob(base, token, instance, sha))
    except (ValueError, OSError) as exc:
        raise ResumeError(str(exc)) from None
    if owner is not None:
        for target in [folder, *(folder / f["sha256"] for f in latest["files"])]:
            os.chown(target, *owner)
    return checkpoint
