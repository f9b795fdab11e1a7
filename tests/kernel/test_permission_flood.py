"""A provider that keeps many permission requests open, through the real driver process (issue 30,
THREATS "a provider can keep any number of prompts open"): the permission port's one bound,
`MAX_OPEN_REQUESTS`, for every runtime.

The provider is our stubborn ACP agent (`[[perms:N]]`: N `session/request_permission`s at once); the
bound is the port's, the same for Codex and Claude.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from driver.ports.permissions import MAX_OPEN_REQUESTS
from tests.integration.harness import INSTANCE, boot_payload, control_plane
from tests.kernel.support import Driver

OVER = 8


async def test_permission_requests_past_the_open_bound_are_refused_without_reaching_the_cp(
    tmp_path: Path, drivers: list[Driver]
) -> None:
    """40 requests at once: the first 32 reach the CP and wait for it; the other 8 are rejected at
    once (the agent hears its reject option), each without `permission.requested`, and the CP is told
    by `diagnostic.reported{permission.too_many_open}`. Before the fix all 40 reached the CP."""
    total = MAX_OPEN_REQUESTS + OVER
    async with control_plane(tmp_path) as cp:
        drivers.append(Driver(tmp_path, boot_payload(tmp_path, cp.url)))
        cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-f", input={"text": f"[[perms:{total}]]"})

        def over_cap(e: dict[str, Any]) -> bool:
            return e["kind"] == "diagnostic.reported" and e["payload"]["code"] == "permission.too_many_open"

        # The refusals and the open requests both arrive; wait for all of both, then check no more came.
        await cp.wait_until(
            lambda: (
                len(cp.events(INSTANCE, "permission.requested", run_id="run-f")) >= MAX_OPEN_REQUESTS
                and sum(over_cap(e) for e in cp.events(INSTANCE)) >= 6
            ),
            timeout=30,
        )
        diagnostics = [e["payload"] for e in cp.events(INSTANCE) if over_cap(e)]
        # Five refusals are told, then one saying the rest are only logged: a bounded report.
        assert len(diagnostics) == 6
        assert all(d["severity"] == "warning" and d["details"]["limit"] == MAX_OPEN_REQUESTS for d in diagnostics)
        assert "too many permission requests open (limit 32)" in diagnostics[0]["message"]
        assert "only logged" in diagnostics[-1]["message"]
        asked = cp.events(INSTANCE, "permission.requested", run_id="run-f")
        assert len(asked) == MAX_OPEN_REQUESTS
        refused_calls = {d["details"]["tool_call_id"] for d in diagnostics}
        assert not refused_calls & {a["payload"]["tool_call_id"] for a in asked}

        # The CP answers the ones it has; the agent then reports every outcome.
        for a in asked:
            allow = next(o["option_id"] for o in a["payload"]["options"] if o["kind"] == "allow_once")
            await cp.send_command(
                INSTANCE, "permission.resolve", request_id=a["payload"]["request_id"], option_id=allow
            )
        status = await cp.wait_for_command_status(cid, timeout=30)
        assert status["status"] == "completed", status
        final = cp.events(INSTANCE, "run.completed", run_id="run-f")[-1]["payload"]
        assert final["final_message_text"] == f"permissions: allow_once={MAX_OPEN_REQUESTS} reject_once={OVER}"
        assert len(cp.events(INSTANCE, "permission.requested", run_id="run-f")) == MAX_OPEN_REQUESTS
        # Each refused tool call ends declined.
        declined = {
            e["payload"]["tool_call_id"]
            for e in cp.events(INSTANCE, "tool.completed", run_id="run-f")
            if e["payload"]["status"] == "declined"
        }
        assert len(declined) == OVER and refused_calls <= declined
