"""The journal's MAC (driver/queue/rowmac.py), crash points and tamper reports: units without I/O."""

from __future__ import annotations

import pytest

from driver.kernel.tamper import diagnostics
from driver.queue.journal_rows import CrashPoint, Finding
from driver.queue.rowmac import RowMac, derive_key, hkdf_sha256


def test_hkdf_matches_rfc_5869_test_case_1() -> None:
    okm = hkdf_sha256(
        bytes.fromhex("0b" * 22), bytes.fromhex("000102030405060708090a0b0c"), bytes.fromhex("f0f1f2f3f4f5f6f7f8f9"), 42
    )
    assert okm.hex() == "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865"


def test_the_key_depends_on_token_and_instance() -> None:
    assert derive_key("t", "i") != derive_key("t", "j") != derive_key("u", "i")
    assert len(derive_key("t", "i")) == 32


def test_event_mac_is_the_generic_encoding_and_binds_every_field() -> None:
    mac = RowMac(derive_key("t", "i"))
    row = (5, "i/1/000005", "run-1", "message.completed", b'{"x":1}')
    assert mac.event(*row) == mac.of("outbox", *row)
    assert mac.event(5, "i/1/000005", None, "message.completed", b'{"x":1}') == mac.of(
        "outbox", 5, "i/1/000005", None, "message.completed", b'{"x":1}'
    )
    good = mac.event(*row)
    assert mac.check_event(good, *row)
    for i, other in enumerate((6, "i/1/000006", None, "message.delta", b'{"x":2}')):
        changed = list(row)
        changed[i] = other
        assert not mac.check_event(good, *changed), i
    # Moving bytes between fields never keeps the MAC (length-prefixed fields).
    assert mac.of("t", "ab", "c") != mac.of("t", "a", "bc")
    assert mac.of("t", None) != mac.of("t", "")
    assert not mac.check_event(good.hex(), *row)  # not bytes
    assert not mac.check_event(good, 5, "i/1/000005", "run-1", "message.completed", '{"x":1}')  # TEXT body
    assert not mac.check(mac.of("meta", "epoch", 1), "meta", "epoch", 1.0)
    assert "key" not in repr(mac).replace("<key>", "")


@pytest.mark.parametrize("spec", ["events.inside", "nope.before:1", "events.later:1", "events.before:x"])
def test_a_bad_crash_point_is_refused_by_name(spec: str) -> None:
    with pytest.raises(ValueError, match="AGENT_DRIVER_CRASH_POINT"):
        CrashPoint(spec)


def test_a_crash_point_counts_only_its_kind_and_boundary(monkeypatch: pytest.MonkeyPatch) -> None:
    killed: list[int] = []
    monkeypatch.setattr("driver.queue.journal_rows.os.kill", lambda pid, sig: killed.append(sig))
    point = CrashPoint("commands.after:2")
    point.reached("after", True, False, False)  # events only: not counted
    point.reached("before", False, False, True)  # another boundary
    point.reached("after", False, False, True)
    assert not killed
    point.reached("after", True, True, True)
    assert len(killed) == 1
    assert not CrashPoint(None).armed


def test_findings_are_reported_one_diagnostic_per_table_and_reason() -> None:
    found = [Finding("outbox", str(s), "mac") for s in range(10, 250)] + [
        Finding("commands", "cmd-1", "mac"),
        Finding("outbox", "7", "type"),
    ]
    out = diagnostics(found)
    assert [(d["details"]["table"], d["details"]["reason"]) for d in out] == [
        ("outbox", "mac"),
        ("commands", "mac"),
        ("outbox", "type"),
    ]
    first = out[0]
    assert first["code"] == "journal.tampered" and first["severity"] == "error"
    assert first["details"]["seq"] == 10 and first["details"]["count"] == 240 and len(first["details"]["keys"]) == 100
    assert "seq" not in out[1]["details"] and out[1]["details"]["key"] == "cmd-1"
