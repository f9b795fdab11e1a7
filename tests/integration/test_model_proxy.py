"""PROTOCOL §6.7 end to end: the real driver runs each REAL runtime (the Claude CLI, Codex app-server,
claude-agent-acp, codex-acp) with `execution.model_proxy`, against the fake model endpoints.

What is checked: the real key arrives at the fake and nowhere else (every process of the provider
tree is read through /proc: environ and argv; every file under the provider's home and cwd); the
fake never sees a placeholder; one `model.usage` per model request, and the run's usage is their
sum; a stream of spaced chunks reaches the control plane as spaced `message.delta` events; a spent
budget ends the run `run.failed{budget.exceeded}`, not retryable; a tool in the tree calling the proxy
with a made-up key, the real key or an old placeholder is refused, and a restarted provider gets a new
placeholder.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from agent_lab.testing.fakes import Fakes

from tests.integration.harness import INSTANCE, ROOT, DriverProcess, control_plane
from tests.integration.test_secrets_in_proc import process_tree, read_proc
from tests.kernel.runtimes import payload as runtime_payload
from tests.kernel.support import wait_provider

SECRET = "sk-REAL-model-key-7f3a9c0e5b1d"
CLAUDE_ACP = ROOT / "node_modules" / "@agentclientprotocol" / "claude-agent-acp" / "dist" / "index.js"
RUNTIMES = ("claude-agent-sdk", "openai-app-server", "acp:claude-agent-acp", "acp:codex-acp")
KEY_VAR = {
    "claude-agent-sdk": "ANTHROPIC_API_KEY",
    "openai-app-server": "OPENAI_API_KEY",
    "acp:claude-agent-acp": "ANTHROPIC_API_KEY",
    "acp:codex-acp": "FAKE_OPENAI_API_KEY",
}
# A tool call, so a run makes two model requests (the call, then the answer after its result).
SHELL = {
    "claude-agent-sdk": "[[shell:echo proxied]]",
    "openai-app-server": "[[shell:echo proxied]]",
    "acp:claude-agent-acp": "[[shell:echo proxied]]",
    "acp:codex-acp": "[[shell:echo proxied]]",
}


@pytest.fixture(scope="module")
def fakes() -> Iterator[Fakes]:
    with ExitStack() as stack:
        yield Fakes(stack)


def fake_of(runtime: str, fakes: Fakes) -> Any:
    return fakes.anthropic if runtime in ("claude-agent-sdk", "acp:claude-agent-acp") else fakes.responses


def proxied_payload(
    runtime: str, tmp: Path, url: str, fakes: Fakes, budget: dict[str, Any] | None = None
) -> dict[str, Any]:
    if runtime == "acp:claude-agent-acp":
        payload = runtime_payload("claude-agent-sdk", tmp, url, fakes)
        state = tmp / "state"
        payload["execution"] |= {
            "runtime": "acp",
            "acp": {
                "command": ["node", str(CLAUDE_ACP)],
                "env": {
                    "ANTHROPIC_BASE_URL": fakes.anthropic.base_url,
                    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                    "CLAUDE_CONFIG_DIR": str(state / "claude"),
                    "CLAUDE_CODE_MAX_RETRIES": "0",
                    "IS_SANDBOX": "1",
                },
            },
        }
        payload["execution"]["environment"] = {"ANTHROPIC_API_KEY": SECRET}
    else:
        payload = runtime_payload(runtime, tmp, url, fakes)
    execution = payload["execution"]
    execution["permission_policy"] = "full_access"
    if runtime == "acp:codex-acp":
        # The upstream comes from the payload, never from the agent's CODEX_HOME/config.toml (§9).
        execution["environment"]["OPENAI_BASE_URL"] = fakes.responses.base_url
    execution["environment"][KEY_VAR[runtime]] = SECRET
    execution["model_proxy"] = {"secrets": [KEY_VAR[runtime]], "budget": budget or {}}
    return payload


def files_holding(root: Path, needle: bytes) -> list[str]:
    hits = []
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            with contextlib.suppress(OSError):
                if path.is_file() and not path.is_symlink() and needle in path.read_bytes():
                    hits.append(str(path))
    return hits


def end_tree(driver: DriverProcess | None) -> None:
    if driver is None:
        return
    leftovers = process_tree(driver.pid)[1:]
    driver.close()
    for pid in leftovers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.provider
@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_the_key_stays_outside_and_usage_is_measured(tmp_path: Path, fakes: Fakes, runtime: str) -> None:
    fake = fake_of(runtime, fakes)
    driver: DriverProcess | None = None
    try:
        async with control_plane(tmp_path) as cp:
            payload = proxied_payload(runtime, tmp_path, cp.url, fakes)
            seen_before = len(fake.request_headers)
            driver = DriverProcess(tmp_path, payload)
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=90)

            # Run 1: a tool call and the answer after it: two model requests, each measured.
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": SHELL[runtime]})
            status = await cp.wait_for_command_status(cid, timeout=90)
            assert status["status"] == "completed", json.dumps(status)
            usage = [e["payload"] for e in cp.events(INSTANCE, "model.usage") if e["payload"]["run_id"] == "run-1"]
            headers = fake.request_headers[seen_before:]
            assert len(usage) >= 2, usage
            # Each model request the fake answered was measured once (the fake may also answer
            # requests of other kinds, e.g. a title, which are model requests too).
            # A request of the agent's own (a title) may still be streaming when the run ends: its
            # usage is measured when its answer ends, so wait for the counts to meet (never to pass).
            measured = lambda: len(cp.events(INSTANCE, "model.usage")) == len(fake.request_headers[seen_before:])  # noqa: E731
            await cp.wait_until(measured, timeout=30)
            headers = fake.request_headers[seen_before:]
            assert len(cp.events(INSTANCE, "model.usage")) == len(headers), (usage, len(headers))
            for u in usage:
                assert u["input_tokens"] > 0 and u["output_tokens"] > 0 and u["request_id"], u
                assert u["upstream"].startswith("http://127.0.0.1:")
            completed = cp.events(INSTANCE, "run.completed", run_id="run-1")
            run_usage = completed[0]["payload"]["usage"]
            assert run_usage["input_tokens"] == sum(u["input_tokens"] for u in usage)
            assert run_usage["output_tokens"] == sum(u["output_tokens"] for u in usage)
            assert run_usage["model_requests"] == len(usage)
            # The key arrived at the fake, in the upstream's own header; no placeholder did.
            auth = [h.get("x-api-key") or h.get("authorization", "") for h in headers]
            assert all(SECRET in a for a in auth), auth
            assert "agent-driver-placeholder-" not in json.dumps(headers)

            # Run 2: a slow stream; the tree is read while it streams.
            cid2, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-2", input={"text": "[[slow]]"})
            deltas: list[dict[str, Any]] = []

            def enough(e: dict[str, Any]) -> bool:
                if e["kind"] == "message.delta" and e["run_id"] == "run-2":
                    deltas.append(e)
                return len(deltas) >= 12

            await cp.wait_for_event(INSTANCE, enough, timeout=90, kinds="message.delta")
            tree = process_tree(driver.pid)
            environ = {pid: read_proc(pid, "environ") for pid in tree[1:]}
            argv = {pid: read_proc(pid, "cmdline") for pid in tree[1:]}
            assert len(tree) >= 2
            assert any(b"agent-driver-placeholder-" in e for e in environ.values())  # the provider got one
            leaks = [pid for pid, e in environ.items() if SECRET.encode() in e]
            assert leaks == [], f"the model key is in the environment of {leaks}"
            leaks = [pid for pid, a in argv.items() if SECRET.encode() in a]
            assert leaks == [], f"the model key is in the argv of {leaks}"
            for root in (tmp_path / "state" / "providers", tmp_path / "cwd"):
                assert files_holding(root, SECRET.encode()) == []
            # The spaced chunks (50 ms apart at the fake) reached the control plane one by one.
            stamps = [datetime.fromisoformat(e["occurred_at"]) for e in deltas[:12]]
            spread = (stamps[-1] - stamps[0]).total_seconds()
            assert spread > 0.2, spread
            cancel, _ = await cp.send_command(INSTANCE, "turn.cancel", run_id="run-2", reason="done")
            await cp.wait_for_command_status(cid2, timeout=60)
            await cp.wait_for_command_status(cancel, timeout=60)
            assert SECRET not in driver.stderr()
    finally:
        end_tree(driver)


@pytest.mark.provider
@pytest.mark.parametrize("runtime", ["claude-agent-sdk", "openai-app-server", "acp:claude-agent-acp"])
async def test_a_spent_budget_fails_the_run(tmp_path: Path, fakes: Fakes, runtime: str) -> None:
    fake = fake_of(runtime, fakes)
    driver: DriverProcess | None = None
    try:
        async with control_plane(tmp_path) as cp:
            # One token: the first request is served (its cost is known only after), the next refused.
            payload = proxied_payload(runtime, tmp_path, cp.url, fakes, budget={"max_tokens_per_run": 1})
            before = len(fake.request_headers)
            driver = DriverProcess(tmp_path, payload)
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=90)
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": SHELL[runtime]})
            status = await cp.wait_for_command_status(cid, timeout=90)
            assert status["status"] == "failed", json.dumps(status)
            failed = cp.events(INSTANCE, "run.failed", run_id="run-1")
            assert len(failed) == 1
            error = failed[0]["payload"]["error"]
            assert error["code"] == "budget.exceeded" and error["retryable"] is False
            assert error["details"]["limit"] == "max_tokens_per_run"
            usage = [e["payload"] for e in cp.events(INSTANCE, "model.usage")]
            # Served in the run: the first request (and any sent alongside it before its usage was
            # known: claude-agent-acp asks for a title in parallel with the first turn).
            assert len([u for u in usage if u["run_id"] == "run-1"]) >= 1
            # Every request that reached the fake was measured: the refused one never reached it. (An
            # agent may make a request of its own outside the run, e.g. claude-agent-acp at start.)
            assert len(fake.request_headers) - before == len(usage)
            # The next run starts with its budget again (a run budget, not a session one): its first
            # request is served. (claude-agent-acp may send a request of its own, e.g. a title, beside
            # the turn's; with a one-token budget the later of the two is refused, so only the served
            # request is checked there, not the run's outcome.)
            cid2, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-2", input={"text": "[[say:again]]"})
            status2 = await cp.wait_for_command_status(cid2, timeout=90)
            assert [u for u in cp.events(INSTANCE, "model.usage") if u["payload"]["run_id"] == "run-2"]
            if runtime != "acp:claude-agent-acp":
                assert status2["status"] == "completed", json.dumps(status2)
            elif status2["status"] == "failed":
                assert (
                    cp.events(INSTANCE, "run.failed", run_id="run-2")[0]["payload"]["error"]["code"]
                    == "budget.exceeded"
                )
    finally:
        end_tree(driver)


def placeholder_of(pid: int, var: str) -> str | None:
    for entry in read_proc(pid, "environ").split(b"\0"):
        if entry.startswith(var.encode() + b"="):
            return entry.split(b"=", 1)[1].decode()
    return None


def curl(base_var: str, key: str) -> str:
    """A shell tool that calls the proxy with `key` and prints the HTTP status."""
    out = "-s -o /dev/null -w 'status=%{http_code}'"
    return f"[[shell:curl {out} -H 'x-api-key: {key}' -d '{{}}' ${base_var}/v1/messages]]"


@pytest.mark.provider
async def test_strangers_in_the_tree_are_refused_and_a_restart_gets_a_fresh_placeholder(
    tmp_path: Path, fakes: Fakes
) -> None:
    driver: DriverProcess | None = None
    try:
        async with control_plane(tmp_path) as cp:
            payload = proxied_payload("claude-agent-sdk", tmp_path, cp.url, fakes)
            driver = DriverProcess(tmp_path, payload)
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=90)
            first = await wait_provider(driver, timeout=30)
            old = placeholder_of(first, "ANTHROPIC_API_KEY")
            assert old is not None and old.startswith("agent-driver-placeholder-")

            async def tool_output(run_id: str, text: str) -> str:
                cid, _ = await cp.send_command(INSTANCE, "input.start", run_id=run_id, input={"text": text})
                assert (await cp.wait_for_command_status(cid, timeout=90))["status"] == "completed"
                done = cp.events(INSTANCE, "tool.completed", run_id=run_id)
                return json.dumps([e["payload"]["output"] for e in done])

            # A tool in the tree: a made-up key and the real key are refused, the placeholder works.
            assert "status=401" in await tool_output("run-1", curl("ANTHROPIC_BASE_URL", "sk-stranger-0000000"))
            assert "status=401" in await tool_output("run-2", curl("ANTHROPIC_BASE_URL", SECRET))
            assert "status=200" in await tool_output("run-3", curl("ANTHROPIC_BASE_URL", old))

            # A new provider process gets a new placeholder; the old one stops working.
            os.killpg(first, signal.SIGKILL)
            second = await wait_provider(driver, timeout=60, exclude=(first,))
            await cp.wait_for_event(
                INSTANCE,
                lambda e: e["kind"] == "diagnostic.reported" and e["payload"]["code"] == "provider.restarted",
                timeout=60,
            )
            new = placeholder_of(second, "ANTHROPIC_API_KEY")
            assert new is not None and new != old
            assert "status=401" in await tool_output("run-4", curl("ANTHROPIC_BASE_URL", old))
            assert "status=200" in await tool_output("run-5", curl("ANTHROPIC_BASE_URL", new))
    finally:
        end_tree(driver)


@pytest.mark.provider
async def test_the_claude_cli_with_an_oauth_token_gets_a_placeholder_bearer(tmp_path: Path, fakes: Fakes) -> None:
    driver: DriverProcess | None = None
    try:
        async with control_plane(tmp_path) as cp:
            payload = proxied_payload("claude-agent-sdk", tmp_path, cp.url, fakes)
            environment = payload["execution"]["environment"]
            del environment["ANTHROPIC_API_KEY"]
            environment["CLAUDE_CODE_OAUTH_TOKEN"] = SECRET
            payload["execution"]["model_proxy"] = {"secrets": ["CLAUDE_CODE_OAUTH_TOKEN"]}
            before = len(fakes.anthropic.request_headers)
            driver = DriverProcess(tmp_path, payload)
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=90)
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": "[[say:hi]]"})
            status = await cp.wait_for_command_status(cid, timeout=90)
            assert status["status"] == "completed", json.dumps(status)
            headers = fakes.anthropic.request_headers[before:]
            assert headers and all(h.get("authorization") == f"Bearer {SECRET}" for h in headers), headers
            assert "agent-driver-placeholder-" not in json.dumps(headers)
            tree = process_tree(driver.pid)[1:]
            assert not [pid for pid in tree if SECRET.encode() in read_proc(pid, "environ")]
    finally:
        end_tree(driver)


@pytest.mark.provider
async def test_a_spent_session_budget_fails_every_later_run(tmp_path: Path, fakes: Fakes) -> None:
    driver: DriverProcess | None = None
    try:
        async with control_plane(tmp_path) as cp:
            # claude-sonnet-4-5 is priced: the first request costs more than this, the next is refused.
            budget = {"max_usd_per_session": 0.000001}
            payload = proxied_payload("claude-agent-sdk", tmp_path, cp.url, fakes, budget=budget)
            driver = DriverProcess(tmp_path, payload)
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=90)
            for run_id, text in (("run-1", SHELL["claude-agent-sdk"]), ("run-2", "[[say:hi]]")):
                cid, _ = await cp.send_command(INSTANCE, "input.start", run_id=run_id, input={"text": text})
                assert (await cp.wait_for_command_status(cid, timeout=90))["status"] == "failed"
                error = cp.events(INSTANCE, "run.failed", run_id=run_id)[0]["payload"]["error"]
                assert (error["code"], error["details"]["limit"]) == ("budget.exceeded", "max_usd_per_session")
            usage = [e["payload"] for e in cp.events(INSTANCE, "model.usage")]
            assert [u["run_id"] for u in usage] == ["run-1"] and usage[0]["cost_usd"] > 0.000001
    finally:
        end_tree(driver)
