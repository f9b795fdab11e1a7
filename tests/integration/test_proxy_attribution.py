"""Issue 30: a background process a run leaves does not spend the next run's budget (PROTOCOL §6.7
"Attribution"), through the real driver and the real Claude CLI.

Run 1's Bash tool starts a loop in its own session (it outlives the tool and the run) that calls the
proxy, on one kept-alive connection, with the placeholder from its environment, as any SDK a tool
runs would. Run 2's tool waits until the loop has made three more requests. The proxy finds the
loop's process from the kernel's socket tables and its start time inside run 1, which has ended: its
requests are the session's (`model.usage` not run-scoped, the payload naming run 1), and run 2's
terminal `usage` and run-scoped `model.usage` hold run 2's own requests only.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from agent_lab.testing.fakes import Fakes

from tests.integration.harness import INSTANCE, DriverProcess, control_plane
from tests.integration.test_model_proxy import end_tree, proxied_payload

BACKGROUND_MODEL = "claude-haiku-4-5-background"

LOOP = f"""
import http.client, json, os, urllib.parse
base = urllib.parse.urlsplit(os.environ["ANTHROPIC_BASE_URL"])
key = os.environ["ANTHROPIC_API_KEY"]
body = json.dumps({{"model": "{BACKGROUND_MODEL}", "max_tokens": 64,
                   "messages": [{{"role": "user", "content": "[[say:background]]"}}]}})
conn = None
done = failed = 0
while done < 2000 and failed < 50:
    try:
        if conn is None:
            conn = http.client.HTTPConnection(base.hostname, base.port, timeout=30)
        conn.request("POST", base.path + "/v1/messages", body,
                     {{"x-api-key": key, "content-type": "application/json", "anthropic-version": "2023-06-01"}})
        status = conn.getresponse()
        status.read()
        done += 1
        failed = 0
        with open("loop.count.tmp", "w") as f:
            f.write(f"{{done}} {{status.status}}")
        os.replace("loop.count.tmp", "loop.count")
    except OSError:
        conn = None
        failed += 1
"""

# Run 2's tool: blocks until the loop has made three more requests (each write is the loop's).
WAIT = """
import os, time
def count():
    try:
        return int(open("loop.count").read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0
start = count()
deadline = time.monotonic() + 60
while count() < start + 3 and time.monotonic() < deadline:
    time.sleep(0.05)
print("LOOP", start, count())
"""


@pytest.fixture(scope="module")
def fakes() -> Iterator[Fakes]:
    with ExitStack() as stack:
        yield Fakes(stack)


@pytest.mark.provider
async def test_a_background_process_of_run_1_does_not_spend_run_2(tmp_path: Path, fakes: Fakes) -> None:
    driver: DriverProcess | None = None
    try:
        async with control_plane(tmp_path) as cp:
            payload = proxied_payload("claude-agent-sdk", tmp_path, cp.url, fakes)
            (tmp_path / "cwd" / "loop.py").write_text(LOOP)
            (tmp_path / "cwd" / "wait.py").write_text(WAIT)
            driver = DriverProcess(tmp_path, payload)
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=90)

            start_loop = "[[shell:setsid nohup python3 loop.py > loop.log 2>&1 < /dev/null &]]"
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": start_loop})
            status = await cp.wait_for_command_status(cid, timeout=90)
            assert status["status"] == "completed", json.dumps(status)

            cid, _ = await cp.send_command(
                INSTANCE, "input.start", run_id="run-2", input={"text": "[[shell:python3 wait.py]]"}
            )
            status = await cp.wait_for_command_status(cid, timeout=120)
            assert status["status"] == "completed", json.dumps(status)
            outputs = json.dumps([e["payload"].get("output") for e in cp.events(INSTANCE, "tool.completed")])
            assert "LOOP" in outputs, outputs

            events = cp.events(INSTANCE)
            started = next(i for i, e in enumerate(events) if e["kind"] == "run.started" and e["run_id"] == "run-2")
            ended = next(i for i, e in enumerate(events) if e["kind"] == "run.completed" and e["run_id"] == "run-2")
            during = [e for e in events[started:ended] if e["kind"] == "model.usage"]
            background = [e for e in during if e["payload"]["model"] == BACKGROUND_MODEL]
            # The loop called during run 2 (its tool waited for three of its requests)...
            assert len(background) >= 3, [e["payload"] for e in during]
            # ...and each was the session's: not run-scoped, its payload naming the run that started it.
            assert all(e["run_id"] is None and e["payload"]["run_id"] == "run-1" for e in background), background
            run2 = [e["payload"] for e in cp.events(INSTANCE, "model.usage") if e["run_id"] == "run-2"]
            assert run2 and all(u["model"] != BACKGROUND_MODEL for u in run2), run2
            usage = events[ended]["payload"]["usage"]
            assert usage["model_requests"] == len(run2), (usage, run2)
            assert usage["input_tokens"] == sum(u["input_tokens"] for u in run2)
            assert usage["output_tokens"] == sum(u["output_tokens"] for u in run2)
    finally:
        end_tree(driver)
