"""Issue 30: the model proxy and the loopback listeners, attacked as the agent would, through the real driver.

- A `base_url` the agent writes into its codex-acp `CODEX_HOME/config.toml` never becomes an upstream:
  after a driver restart, the agent's own listener gets no key (the proxied copy names the proxy's
  `/openai` route, whose upstream is the payload's); a link planted where the copy is written is
  replaced, not written through.
- A script in the provider tree (run by the real Claude CLI's Bash tool, with the provider's
  environment) tries the relay: `POST /v1/messages#x` is metered like `/v1/messages`; batches,
  `/v1/complete`, embeddings are refused 404 and never reach the upstream; 8 parallel requests under a
  token budget reach the upstream once or twice, not 8 times.
- Loopback exhaustion: keyless connections with huge bodies and idle sockets against the model proxy
  and the host MCP server leave the driver's memory bounded and are closed by the deadlines, while a
  keyed request is served.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx2
import pytest
from agent_lab.evidence.attack_kit import KeyCatcher, closed_within, flood, listening_ports
from agent_lab.testing.fakes import Fakes

from tests.integration.harness import INSTANCE, DriverProcess, boot_payload, control_plane
from tests.integration.test_model_proxy import SECRET, end_tree, placeholder_of, proxied_payload
from tests.kernel.support import wait_provider


@pytest.fixture(scope="module")
def fakes() -> Iterator[Fakes]:
    with ExitStack() as stack:
        yield Fakes(stack)


@pytest.mark.provider
async def test_a_base_url_the_agent_writes_into_codex_home_never_gets_the_key(tmp_path: Path, fakes: Fakes) -> None:
    catcher = KeyCatcher()
    driver: DriverProcess | None = None
    try:
        async with control_plane(tmp_path) as cp:
            payload = proxied_payload("acp:codex-acp", tmp_path, cp.url, fakes)
            home = Path(payload["execution"]["acp"]["env"]["CODEX_HOME"])
            # What the agent does between two driver starts: a provider of its own in its config, made
            # the one codex-acp uses, and a link where the driver writes its proxied copy, naming a
            # file of the driver's (the journal stands for any).
            config = (home / "config.toml").read_text()
            config = config.replace('model_provider = "driver"', 'model_provider = "mine"')
            config += f'\n[model_providers.mine]\nname = "mine"\nbase_url = "{catcher.url}"\n'
            config += 'wire_api = "responses"\nenv_key = "FAKE_OPENAI_API_KEY"\nrequires_openai_auth = false\n'
            (home / "config.toml").write_text(config)
            proxied = tmp_path / "state" / "providers" / "acp" / "codex-home-proxied"
            proxied.mkdir(parents=True)
            victim = tmp_path / "victim.txt"
            victim.write_text("the driver's own file")
            (proxied / "config.toml").symlink_to(victim)
            (proxied / "config.toml.tmp").symlink_to(victim)

            driver = DriverProcess(tmp_path, payload)
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=90)
            cid, _ = await cp.send_command(INSTANCE, "input.start", run_id="run-1", input={"text": "[[say:hi]]"})
            status = await cp.wait_for_command_status(cid, timeout=90)
            assert [s for s in catcher.seen if SECRET in s] == [], "the agent's listener got the real key"
            assert catcher.seen == []  # the agent's URL is not even called: the copy names the proxy
            assert status["status"] == "completed", json.dumps(status)
            assert victim.read_text() == "the driver's own file"
            copied = (proxied / "config.toml").read_text()
            assert not (proxied / "config.toml").is_symlink() and catcher.url not in copied
            assert any(u["payload"]["run_id"] == "run-1" for u in cp.events(INSTANCE, "model.usage"))
    finally:
        end_tree(driver)
        catcher.close()


ATTACK = r"""
import http.client, json, os, sys, threading, urllib.parse
base = urllib.parse.urlsplit(os.environ["ANTHROPIC_BASE_URL"])
key = os.environ["ANTHROPIC_API_KEY"]
# A slow stream (the fake spaces its chunks), so the burst's requests are all in flight at once.
body = json.dumps({"model": "claude-sonnet-4-5", "max_tokens": 1500, "stream": True,
                   "messages": [{"role": "user", "content": "[[slow]]"}]})
def call(path, results, name):
    c = http.client.HTTPConnection(base.hostname, base.port, timeout=30)
    c.request("POST", base.path + path, body, {"x-api-key": key, "content-type": "application/json",
                                               "anthropic-version": "2023-06-01"})
    r = c.getresponse(); r.read(); results[name] = r.status
def save(results):  # a file as well as stdout: the budget may end the run (and this tool) mid-burst
    with open("attack-results.json.tmp", "w") as f:
        json.dump(results, f)
    os.replace("attack-results.json.tmp", "attack-results.json")
results = {}
for path in ("/v1/messages#x", "/v1/messages/batches", "/v1/complete", "/v1/embeddings", "/v1/../v1/files"):
    call(path, results, path)
save(results)
burst = {}
threads = [threading.Thread(target=call, args=("/v1/messages", burst, i)) for i in range(8)]
[t.start() for t in threads]; [t.join() for t in threads]
results["burst"] = sorted(burst.values())
save(results)
print("RESULTS=" + json.dumps(results))
"""


@pytest.mark.provider
async def test_a_script_in_the_tree_cannot_use_the_proxy_as_a_relay_or_outrun_the_budget(
    tmp_path: Path, fakes: Fakes
) -> None:
    driver: DriverProcess | None = None
    try:
        async with control_plane(tmp_path) as cp:
            payload = proxied_payload("claude-agent-sdk", tmp_path, cp.url, fakes, budget={"max_tokens_per_run": 3000})
            (tmp_path / "cwd" / "attack.py").write_text(ATTACK)
            fake = fakes.anthropic
            driver = DriverProcess(tmp_path, payload)
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=90)
            before_messages = len(fake.request_headers)
            before_other = len(fake.other_requests)
            cid, _ = await cp.send_command(
                INSTANCE, "input.start", run_id="run-1", input={"text": "[[shell:python3 attack.py]]"}
            )
            await cp.wait_for_command_status(cid, timeout=120)
            # The run ends budget.exceeded at the burst's first refusal, and its interrupt may stop the
            # script before it prints: what it measured before the burst is in its file (written before
            # any burst request was sent, so before the run could end), the burst's figures when it got
            # that far (the budget's bound is checked from model.usage below, whatever the script saw).
            results = json.loads((tmp_path / "cwd" / "attack-results.json").read_text())
            # Nothing but the model endpoint went upstream: no batch, completion, embedding or file call.
            others = [path for _, path, _ in fake.other_requests[before_other:]]
            assert others == [], others
            for path in ("/v1/messages/batches", "/v1/complete", "/v1/embeddings", "/v1/../v1/files"):
                assert results[path] == 404, results
            # The fragment request was served and measured like any /v1/messages.
            assert results["/v1/messages#x"] == 200, results
            # 8 at once, each with a worst case of 1500 output tokens, under 3000 tokens: each waits for
            # the reservations before it, so what the run was charged overshoots the budget by at most
            # about one request's worst case (the tests/model_proxy burst test shows 8 becoming 2).
            assert set(results.get("burst", [])) <= {200, 429}, results
            charged = sum(
                u["payload"]["input_tokens"] + u["payload"]["output_tokens"]
                for u in cp.events(INSTANCE, "model.usage")
                if u["run_id"] == "run-1"
            )
            assert charged <= 3000 + 1500 + 200, charged
            reached = len(fake.request_headers) - before_messages
            usage = cp.events(INSTANCE, "model.usage")
            assert reached == len(usage), (reached, len(usage))  # every upstream request was measured
            run_usage = [e["payload"] for e in usage if e["run_id"] == "run-1"]
            terminal = [e for e in cp.events(INSTANCE) if e["kind"].startswith("run.") and e["run_id"] == "run-1"]
            if terminal[-1]["kind"] == "run.completed":
                total = terminal[-1]["payload"]["usage"]
                assert total["model_requests"] == len(run_usage)
    finally:
        end_tree(driver)


# -- loopback exhaustion -------------------------------------------------------------------------------


def vm(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


@pytest.mark.provider
async def test_keyless_floods_and_idle_sockets_leave_the_driver_bounded(tmp_path: Path, fakes: Fakes) -> None:
    driver: DriverProcess | None = None
    try:
        async with control_plane(tmp_path) as cp:
            payload = boot_payload(tmp_path, cp.url)
            execution = payload["execution"]
            execution["environment"] = {"ANTHROPIC_API_KEY": SECRET, "ANTHROPIC_BASE_URL": fakes.anthropic.base_url}
            execution["model_proxy"] = {"secrets": ["ANTHROPIC_API_KEY"]}
            execution["host_tools"] = [{"name": "lookup", "description": "d", "input_schema": {"type": "object"}}]
            driver = DriverProcess(tmp_path, payload)
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=60)
            provider = await wait_provider(driver, timeout=30)
            placeholder = placeholder_of(provider, "ANTHROPIC_API_KEY")
            proxy_port = int(placeholder_of(provider, "ANTHROPIC_BASE_URL").rsplit(":", 1)[1].split("/")[0])  # type: ignore[union-attr]
            # The host server is listening once the agent's session exists (the driver's ready state).
            await cp.wait_until(lambda: (cp.last_heartbeat(INSTANCE) or {}).get("state") == "ready", timeout=60)
            mcp_port = min(listening_ports(driver.pid) - {proxy_port})
            base_peak = vm(driver.pid, "VmHWM")

            # Idle sockets first (they must not lock the keyed request out), then the floods.
            idle = [socket.create_connection(("127.0.0.1", p)) for p in (proxy_port, mcp_port) for _ in range(20)]
            size = 30 * 1024 * 1024
            proxy_head = (f"POST /anthropic/v1/messages HTTP/1.1\r\nhost: x\r\ncontent-length: {size}\r\n\r\n").encode()
            mcp_size = 15 * 1024 * 1024  # under the host server's old 16 MiB cap, so it would have read it
            mcp_head = f"POST /mcp HTTP/1.1\r\nhost: x\r\ncontent-length: {mcp_size}\r\n\r\n".encode()
            floods = [flood(proxy_port, proxy_head, size) for _ in range(8)]
            floods += [flood(mcp_port, mcp_head, mcp_size) for _ in range(8)]
            async with httpx2.AsyncClient(timeout=30) as client:

                async def keyed() -> int:
                    r = await client.post(
                        f"http://127.0.0.1:{proxy_port}/anthropic/v1/messages",
                        headers={"x-api-key": placeholder or ""},
                        json={
                            "model": "claude-sonnet-4-5",
                            "max_tokens": 50,
                            "messages": [{"role": "user", "content": "hi"}],
                        },
                    )
                    return r.status_code

                status, *_ = await asyncio.gather(keyed(), *floods)
            assert status == 200
            grown = vm(driver.pid, "VmHWM") - base_peak
            assert grown < 64 * 1024 * 1024, f"the driver grew by {grown / 2**20:.0f} MiB"
            # The idle sockets are closed by the head deadline (10 s), not kept forever.
            closed = await asyncio.to_thread(closed_within, idle, 20.0)
            assert closed == len(idle), f"{len(idle) - closed} idle sockets still open"
            for s in idle:
                s.close()
            assert driver.proc.poll() is None
    finally:
        end_tree(driver)


# -- a keyed body built to cost the driver memory when parsed ---------------------------------------------

AMPLIFY = r"""
import http.client, json, os, sys, urllib.parse
# 3 bytes of JSON per empty object: parsed into Python objects, ~70 bytes each (23x the body).
def objects(size):
    n = size // 3
    return b"[" + b"{}," * (n - 1) + b"{}]"
out = {}
base = urllib.parse.urlsplit(os.environ["ANTHROPIC_BASE_URL"])
c = http.client.HTTPConnection(base.hostname, base.port, timeout=60)
c.request("POST", base.path + "/v1/messages", objects(30 * 1024 * 1024),
          {"x-api-key": os.environ["ANTHROPIC_API_KEY"], "content-type": "application/json"})
r = c.getresponse(); r.read(); out["proxy"] = r.status
# A path escape that is not UTF-8: answered 404 like any unlisted path, not dropped unanswered.
c = http.client.HTTPConnection(base.hostname, base.port, timeout=60)
try:
    c.request("POST", base.path + "/v1/mess%ffages", b"{}", {"x-api-key": os.environ["ANTHROPIC_API_KEY"]})
    r = c.getresponse(); r.read(); out["escape"] = r.status
except ConnectionError as exc:
    out["escape"] = type(exc).__name__
body = b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":' + objects(15 * 1024 * 1024) + b"}}"
c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=60)
c.request("POST", "/mcp", body, {"authorization": "Bearer " + os.environ["AGENT_DRIVER_HOST_MCP_TOKEN"],
                                 "content-type": "application/json", "accept": "application/json"})
r = c.getresponse(); out["mcp"] = [r.status, r.read()[:200].decode()]
print("RESULTS=" + json.dumps(out))
"""


@pytest.mark.provider
async def test_a_keyed_body_of_tiny_objects_does_not_grow_the_driver(tmp_path: Path, fakes: Fakes) -> None:
    """The agent holds the placeholder and the host server's token, so the head is accepted; a 30 MiB
    body of `{}`s parsed whole would put ~700 MiB of Python objects in the driver (and stall its loop).
    The proxy reads only the fields it meters, the host server refuses a request of that shape."""
    driver: DriverProcess | None = None
    try:
        async with control_plane(tmp_path) as cp:
            payload = proxied_payload("claude-agent-sdk", tmp_path, cp.url, fakes)
            payload["execution"]["host_tools"] = [
                {"name": "lookup", "description": "d", "input_schema": {"type": "object"}}
            ]
            (tmp_path / "cwd" / "amplify.py").write_text(AMPLIFY)
            driver = DriverProcess(tmp_path, payload)
            await cp.wait_for_event(INSTANCE, lambda e: e["kind"] == "driver.started", timeout=90)
            provider = await wait_provider(driver, timeout=30)
            proxy_port = int(placeholder_of(provider, "ANTHROPIC_BASE_URL").rsplit(":", 1)[1].split("/")[0])  # type: ignore[union-attr]
            await cp.wait_until(lambda: (cp.last_heartbeat(INSTANCE) or {}).get("state") == "ready", timeout=60)
            mcp_port = min(listening_ports(driver.pid) - {proxy_port})
            base_peak = vm(driver.pid, "VmHWM")
            cid, _ = await cp.send_command(
                INSTANCE, "input.start", run_id="run-1", input={"text": f"[[shell:python3 amplify.py {mcp_port}]]"}
            )
            await cp.wait_for_command_status(cid, timeout=120)
            outputs = json.dumps([e["payload"].get("output") for e in cp.events(INSTANCE, "tool.completed")])
            assert "RESULTS=" in outputs, outputs[:2000]
            start = outputs.index("RESULTS=") + len("RESULTS=")
            results = json.loads(json.loads('"' + outputs[start : outputs.index("]}", start) + 2] + '"'))
            assert results["proxy"] == 400, results  # not a JSON object: refused, never forwarded
            assert results["escape"] == 404, results
            assert results["mcp"][0] in (200, 400), results
            assert '"result"' not in results["mcp"][1], results  # refused, not answered as a ping
            grown = vm(driver.pid, "VmHWM") - base_peak
            assert grown < 160 * 1024 * 1024, f"the driver grew by {grown / 2**20:.0f} MiB"
            assert driver.proc.poll() is None
    finally:
        end_tree(driver)
