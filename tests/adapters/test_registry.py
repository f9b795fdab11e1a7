"""The registry's static capability table matches what each adapter class declares, and loading is lazy."""

from __future__ import annotations

import subprocess
import sys

import pytest

from driver.adapters.registry import ADAPTERS, adapter_class
from driver.protocol.capabilities import BY_RUNTIME as CAPABILITIES


@pytest.mark.parametrize("runtime", sorted(ADAPTERS))
def test_static_capabilities_match_the_class(runtime: str) -> None:
    assert adapter_class(runtime).capabilities == CAPABILITIES[runtime]
    assert adapter_class(runtime).runtime == runtime


def test_unknown_runtime_is_named() -> None:
    with pytest.raises(ValueError, match="unknown runtime 'nope'"):
        adapter_class("nope")


def test_kernel_import_does_not_load_any_provider_sdk() -> None:
    code = (
        "import sys, driver.kernel, driver.net.link, driver.cli\n"
        "loaded = [m for m in ('claude_agent_sdk', 'openai', 'driver.adapters.claude', 'driver.adapters.codex',"
        " 'driver.adapters.acp') if m in sys.modules]\n"
        "print(','.join(loaded))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""


def test_the_claude_adapter_does_not_load_the_claude_sdk_or_mcp() -> None:
    """Issue 35: importing `claude_agent_sdk` cost the driver 43 MB (its `mcp` and pydantic models);
    the adapter speaks the CLI's wire itself (driver/adapters/claude/client.py)."""
    code = (
        "import sys, driver.adapters.claude.adapter\n"
        "print(','.join(m for m in ('claude_agent_sdk', 'mcp', 'pydantic', 'jsonschema') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""
