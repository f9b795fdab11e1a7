"""Real ACP agent processes without a model, shipped in the lab so `agent-driver evidence` and the
benches run from an install: each is a script run as `python PATH ...` (it imports nothing of ours).

- `STUBBORN`: answers prompts from markers, and misbehaves on request (slow, deaf to cancel, crashing,
  malformed output, ...): see its docstring for the modes.
- `FLOOD`: emits numbered steps at a chosen rate, so a hole or a duplicate in what the control plane
  stored is visible (the fault suite, the `events` claim).
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
STUBBORN = HERE / "stubborn_acp_agent.py"
FLOOD = HERE / "flood_acp_agent.py"
