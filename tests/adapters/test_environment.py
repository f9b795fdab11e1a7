"""`child_env`, the one function every child's environment goes through (issue 30, THREATS 9): by value,
not by name."""

from __future__ import annotations

from typing import Any

import msgspec

from driver.adapters.common import environment
from driver.adapters.common.environment import child_env, withheld_of, withhold_execution
from driver.protocol.boot import BOOT_DECODER, BootPayload

KEY = "sk-real-key-0123456789"
TOKEN = "control-token-abcdef"


def boot(**execution: Any) -> BootPayload:
    payload = {
        "protocol": 1,
        "driver_instance_id": "drv-1",
        "control": {"url": "ws://127.0.0.1:1/x", "token": TOKEN},
        "session": {"id": "s", "agent_id": "a", "kind": "cattle", "cwd": "/tmp", "state_dir": "/tmp/s"},
        "execution": {"revision": "r", "runtime": "acp", "acp": {"command": ["x"]}, **execution},
    }
    return BOOT_DECODER.decode(msgspec.json.encode(payload))


def test_a_withheld_value_is_dropped_under_any_name_and_inside_another_value() -> None:
    env = child_env(
        {"ANTHROPIC_API_KEY": KEY, "OTHER": KEY, "AUTH": f"Bearer {KEY}", "PATH": "/bin"},
        {"LATER": KEY, "OK": "fine"},
        withheld=[KEY],
    )
    assert env == {"PATH": "/bin", "OK": "fine"}


def test_a_short_withheld_value_is_dropped_only_when_it_is_the_whole_value() -> None:
    assert child_env({"A": "abc", "PATH": "/usr/abc/bin"}, withheld=["abc"]) == {"PATH": "/usr/abc/bin"}


def test_names_and_the_drivers_own_variables_are_dropped_and_later_layers_win() -> None:
    env = child_env({"X": "1", "AGENT_DRIVER_BOOT_FILE": "/b"}, {"X": "2", "SECRET_NAME": "v"}, names=["SECRET_NAME"])
    assert env == {"X": "2"}


def test_the_withheld_values_are_the_token_and_with_the_proxy_its_secrets() -> None:
    plain = boot(environment={"ANTHROPIC_API_KEY": KEY})
    assert withheld_of(plain) == {TOKEN}  # without the proxy the provider is given its key
    proxied = boot(environment={"ANTHROPIC_API_KEY": KEY, "B": "b"}, model_proxy={"secrets": ["ANTHROPIC_API_KEY"]})
    assert withheld_of(proxied) == {TOKEN, KEY}


def test_registered_values_reach_every_call_and_the_snapshot_envs(monkeypatch: Any) -> None:
    monkeypatch.setattr(environment, "_WITHHELD", set())
    environment.withhold([KEY])
    assert child_env({"ALIAS": KEY, "A": "a"}) == {"A": "a"}
    execution = boot(
        environment={"ANTHROPIC_API_KEY": KEY, "SECOND": KEY},
        acp={"command": ["x"], "env": {"AGENT_KEY": KEY, "MODE": "m"}},
        mcp_servers=[{"name": "s", "transport": "stdio", "command": ["srv"], "env": {"K": KEY, "L": "l"}}],
    ).execution
    scrubbed = withhold_execution(execution)
    assert scrubbed.environment == {}
    assert scrubbed.acp is not None and scrubbed.acp.env == {"MODE": "m"}
    assert scrubbed.mcp_servers[0].env == {"L": "l"}
