"""The control plane's command-line client retries a refused connection under tenacity, and only that."""

from __future__ import annotations

import io
import json
import urllib.error
from typing import Any

import pytest
import tenacity
from agent_lab.controlplane import cli


class Answer(io.BytesIO):
    status = 200

    def __enter__(self) -> Answer:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def scripted(monkeypatch: pytest.MonkeyPatch, outcomes: list[BaseException | None]) -> list[int]:
    calls: list[int] = []

    def urlopen(req: Any, timeout: float) -> Answer:
        calls.append(1)
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome
        return Answer(json.dumps({"ok": True}).encode())

    monkeypatch.setattr(cli.urllib.request, "urlopen", urlopen)
    monkeypatch.setattr(cli, "RETRY_REFUSED", cli.RETRY_REFUSED.copy(wait=tenacity.wait_none()))
    return calls


def refused() -> urllib.error.URLError:
    return urllib.error.URLError(ConnectionRefusedError(111, "Connection refused"))


def test_a_refused_connection_is_retried_until_the_control_plane_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = scripted(monkeypatch, [refused(), refused(), None])
    assert cli._call("http://127.0.0.1:1", "tok", "GET", "/api/faults") == (200, {"ok": True})
    assert len(calls) == 3


def test_retries_are_bounded_and_end_in_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = scripted(monkeypatch, [refused()] * 10)
    status, body = cli._call("http://127.0.0.1:1", "tok", "POST", "/api/instances/x/commands", {"kind": "k"})
    assert status == 0 and body["error"].startswith("cannot reach http://127.0.0.1:1")
    assert len(calls) == 5


def test_other_failures_are_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    # A timeout may have reached the control plane: sending the command again could store it twice.
    calls = scripted(monkeypatch, [urllib.error.URLError(TimeoutError("timed out")), None])
    status, _ = cli._call("http://127.0.0.1:1", "tok", "POST", "/api/instances/x/commands", {"kind": "k"})
    assert status == 0 and len(calls) == 1
