"""The console's rules for requests that change something (console/guard.py) and its sessions and
one-time login codes (console/sessions.py), without a server (PROTOCOL §9)."""

from __future__ import annotations

import pytest
from agent_lab.controlplane.console import guard
from agent_lab.controlplane.console.sessions import LoginCodes, Sessions

PORT = 8766
OWN = {"host": f"127.0.0.1:{PORT}", "origin": f"http://127.0.0.1:{PORT}"}
JSON = {"content-type": "application/json; charset=utf-8", "content-length": "2"}


def refusal(method: str = "POST", parts: list[str] | None = None, *, cookie: bool = True, **headers: str) -> str | None:
    return guard.refusal(
        method, parts or ["api", "instances", "i", "commands"], headers, port=PORT, bound_host="127.0.0.1",
        cookie_session=cookie,
    )  # fmt: skip


def test_the_console_own_json_request_passes() -> None:
    assert refusal(**OWN, **JSON) is None
    assert refusal(host=f"localhost:{PORT}", origin=f"http://localhost:{PORT}", **JSON) is None
    assert refusal("GET", origin="http://127.0.0.1:1") is None  # reading changes nothing


@pytest.mark.parametrize(
    "origin",
    [
        f"http://127.0.0.1:{PORT + 1}",
        f"http://localhost:{PORT + 1}",
        "null",
        f"https://127.0.0.1:{PORT}",
        "http://evil",
    ],
)
def test_another_origin_is_refused_even_with_a_json_body(origin: str) -> None:
    reason = refusal(host=f"127.0.0.1:{PORT}", origin=origin, **JSON)
    assert reason is not None and "cross-origin" in reason


def test_a_rebound_host_name_is_not_the_console_origin() -> None:
    reason = refusal(host=f"evil.example:{PORT}", origin=f"http://evil.example:{PORT}", **JSON)
    assert reason is not None and "cross-origin" in reason


def test_a_session_request_needs_an_origin_and_json() -> None:
    assert "Origin" in str(refusal(host=OWN["host"], **JSON))
    for media in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", ""):
        reason = refusal(**OWN, **{"content-type": media, "content-length": "5"})
        assert reason is not None and "JSON" in reason, media
    assert "JSON" in str(refusal(**OWN))  # even without a body, a session request declares JSON


def test_bearer_clients_need_json_only_for_a_body() -> None:
    assert refusal(cookie=False, host=OWN["host"]) is None  # POST .../terminate from the CLI
    assert refusal(cookie=False, host=OWN["host"], **JSON) is None
    assert "JSON" in str(refusal(cookie=False, **{"content-type": "text/plain", "content-length": "3"}))


def test_the_login_form_is_form_encoded_but_same_origin() -> None:
    form = {"content-type": "application/x-www-form-urlencoded", "content-length": "9"}
    assert refusal(parts=["login"], cookie=False, **OWN, **form) is None
    assert refusal(parts=["login"], cookie=False, **form) is None  # a non-browser client sends no Origin
    assert refusal(parts=["login"], cookie=False, host=OWN["host"], origin="http://127.0.0.1:1", **form)


def test_sessions_are_random_bound_to_the_port_and_only_issued_ones_are_valid() -> None:
    sessions = Sessions("console-token-abc")
    a, b = sessions.issue(PORT), sessions.issue(PORT)
    assert a != b and len(a) >= 40 and "console-token-abc" not in a
    assert sessions.valid(a, PORT) and sessions.valid(b, PORT)
    assert not sessions.valid(a, PORT + 1)  # another console's port
    assert Sessions("console-token-abc").valid(a, PORT)  # a restart with the same token keeps it
    assert not Sessions("another-token").valid(a, PORT)
    issued, nonce, mac = a.split(".")
    assert not sessions.valid(f"{issued}.{nonce}x.{mac}", PORT)  # not issued: the MAC fails
    assert not sessions.valid(f"1.{nonce}.{mac}", PORT)
    for junk in ("forged", None, "", "a.b", "a.b.c.d", "console-token-abc"):
        assert not sessions.valid(junk, PORT)


def test_a_login_code_works_once() -> None:
    codes = LoginCodes()
    code = codes.mint()
    assert codes.redeem(code) is True
    assert codes.redeem(code) is False
    assert codes.redeem("never-minted") is False
