"""The fake model endpoints as one lazily started set: each starts on first use, all close with the stack.

Shared by the real-runtime tests (tests/kernel/runtimes.py) and `agent-driver evidence`.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any


@dataclass
class Fakes:
    """The fake model endpoints, started on first use and closed with the stack."""

    stack: ExitStack
    _anthropic: Any = None
    _responses: Any = None

    @property
    def anthropic(self) -> Any:
        if self._anthropic is None:
            from agent_lab.testing.fake_anthropic import FakeAnthropic

            self._anthropic = self.stack.enter_context(FakeAnthropic())
        return self._anthropic

    @property
    def responses(self) -> Any:
        if self._responses is None:
            from agent_lab.testing.fake_responses import FakeResponses

            self._responses = self.stack.enter_context(FakeResponses())
        return self._responses

    def requests(self, runtime: str) -> list[dict[str, Any]]:
        """Every model request the runtime's fake received so far, in order."""
        fake = self.anthropic if runtime == "claude-agent-sdk" else self.responses
        return list(fake.requests)
