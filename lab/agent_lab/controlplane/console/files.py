"""Files through the console: attachments uploaded for `input.start`, and artifact downloads.

Uploads are kept under a random folder name and offered to the driver at a capability URL
(`/uploads/<random>/<name>`): the driver fetches attachments by URL (PROTOCOL §6.5) and cannot present
the console token, so the unguessable path is the credential. Artifacts: the protocol reports only
path, size and sha256, so a file is served only from a folder the console was told is the instance's
`cwd`, only inside it, and only while its bytes still hash to what the driver reported.
"""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
from http import HTTPStatus
from pathlib import Path, PurePosixPath

from agent_lab.controlplane.console.httpio import HttpError

MAX_UPLOAD = 64 * 1024 * 1024


def plain_name(name: str | None) -> str:
    if not name:
        raise HttpError(HTTPStatus.BAD_REQUEST, "name (the file name) is required")
    if len(PurePosixPath(name).parts) != 1 or name in (".", "..") or "\\" in name or "\0" in name or len(name) > 200:
        raise HttpError(HTTPStatus.BAD_REQUEST, "name must be a plain file name (no folders, at most 200 characters)")
    return name


def save_upload(root: Path, name: str, data: bytes) -> tuple[str, dict[str, object]]:
    """Store the bytes; (the URL path to fetch them, the attachment fields but `url`)."""
    name = plain_name(name)
    key = secrets.token_urlsafe(24)
    folder = root / key
    folder.mkdir(parents=True, mode=0o700)
    (folder / name).write_bytes(data)
    return f"/uploads/{key}/{name}", {"name": name, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


def read_upload(root: Path, key: str, name: str) -> bytes:
    if not key or "/" in key or key.startswith("."):
        raise HttpError(HTTPStatus.NOT_FOUND, "not found")
    path = root / key / plain_name(name)
    try:
        return path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        raise HttpError(HTTPStatus.NOT_FOUND, "not found") from None


def raw_name(path_b64: object) -> str | None:
    """The name `path_b64` holds, as the str `os` opens those exact bytes by (surrogate escapes)."""
    if not isinstance(path_b64, str):
        return None
    try:
        return os.fsdecode(base64.b64decode(path_b64, validate=True))
    except ValueError:
        raise HttpError(HTTPStatus.BAD_REQUEST, "the artifact's path_b64 is not base64") from None


def read_artifact(cwd: Path | None, rel: str, sha256: str) -> bytes:
    if cwd is None:
        raise HttpError(HTTPStatus.NOT_FOUND, "this control plane cannot read this instance's files")
    root = cwd.resolve()
    path = (root / rel).resolve()
    if not path.is_relative_to(root):
        raise HttpError(HTTPStatus.FORBIDDEN, "artifact path leaves the instance's cwd")
    try:
        data = path.read_bytes()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise HttpError(HTTPStatus.GONE, f"{rel} is no longer there") from None
    if hashlib.sha256(data).hexdigest() != sha256:
        raise HttpError(HTTPStatus.CONFLICT, f"{rel} changed since the driver reported it")
    return data
