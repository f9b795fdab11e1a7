"""The model proxy's cost (PROTOCOL §6.7): time to first token with and without it, interleaved in one
run, and its throughput for 10 concurrent streams.

Three processes, as in a sandbox: the upstream (the lab's fake Anthropic API for first tokens; a
"blast" upstream that streams SSE as fast as it can for throughput), the proxy (this process's event
loop, as in the driver), and the client (a subprocess with a keep-alive httpx2 client, like a
provider's SDK). The client alternates direct and proxied requests, so drift on a shared machine hits
both alike. Goal: at most +5 ms p50 and +15 ms p95 on the first token.

The proxy attributes each connection to the process holding its client socket (one lookup in /proc
per new connection, off the event loop, while the head arrives): here over the bench's own tree, the
client subprocess included. So first tokens are measured twice: on kept-alive connections (as an SDK
sends them: the lookup is paid once) and with a new connection per request (`connection: close`:
every request pays it).

`python -m agent_lab.bench.model_proxy [--requests N]`
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agent_lab.bench._common import ROOT, percentile, table
from driver.model_proxy.budget import Ledger
from driver.model_proxy.plan import Route
from driver.model_proxy.server import ModelProxy, UsageRecord
from driver.protocol.boot import Budget
from driver.telemetry import sockowner

KEY = "sk-bench-real-key-0123456789"
BODY = {
    "model": "claude-sonnet-4-5",
    "max_tokens": 64,
    "stream": True,
    "messages": [{"role": "user", "content": "[[say:the first token arrives here and then some more words]]"}],
}
BLAST_EVENT = b"event: content_block_delta\ndata: " + json.dumps({"delta": {"text": "x" * 900}}).encode() + b"\n\n"
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
BLAST_BYTES = 8 * 1024 * 1024  # per stream


# -- the client (a subprocess) ------------------------------------------------------------------------
def client_ttft(direct: str, proxied: str, placeholder: str, n: int, fresh: bool) -> dict[str, list[float]]:
    import httpx2

    close = {"connection": "close"} if fresh else {}
    out: dict[str, list[float]] = {"direct": [], "proxied": []}
    with httpx2.Client(timeout=30) as client:
        for i in range(n * 2 + 4):
            which = "direct" if i % 2 == 0 else "proxied"
            url, key = (direct, KEY) if which == "direct" else (proxied, placeholder)
            t0 = time.perf_counter()
            with client.stream("POST", url + "/v1/messages", headers={"x-api-key": key, **close}, json=BODY) as r:
                first = None
                for chunk in r.iter_raw():
                    if first is None and b"text_delta" in chunk:
                        first = time.perf_counter() - t0
            if i >= 4 and first is not None:  # the first two of each warm connections up
                out[which].append(first * 1000)
    return out


async def client_throughput(url: str, key: str, streams: int) -> dict[str, float]:
    import httpx2

    async def one(client: httpx2.AsyncClient) -> int:
        got = 0
        async with client.stream("POST", url + "/v1/messages", headers={"x-api-key": key}, json=BODY) as r:
            async for chunk in r.aiter_raw():
                got += len(chunk)
        return got

    async with httpx2.AsyncClient(timeout=60, limits=httpx2.Limits(max_connections=streams)) as client:
        await one(client)  # warm
        t0 = time.perf_counter()
        sizes = await asyncio.gather(*(one(client) for _ in range(streams)))
        elapsed = time.perf_counter() - t0
    return {"bytes": float(sum(sizes)), "seconds": elapsed}


# -- the blast upstream (a subprocess) ----------------------------------------------------------------
async def blast_upstream(port_file: str) -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                await reader.readexactly(length)
                writer.write(HEAD)
                block = BLAST_EVENT * 16
                frame = f"{len(block):x}\r\n".encode() + block + b"\r\n"
                for _ in range(BLAST_BYTES // len(block)):
                    writer.write(frame)
                    await writer.drain()
                writer.write(b"0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    Path(port_file).write_text(str(server.sockets[0].getsockname()[1]))
    await server.serve_forever()


# -- the orchestration ---------------------------------------------------------------------------------
class TreeOwners:
    """The driver's attribution lookup (driver/model_proxy/room.py), over this process's tree."""

    def __init__(self) -> None:
        self.found = 0
        self.lookups = 0

    async def identify(self, client_port: int, server_port: int) -> object:
        import anyio

        owner = await anyio.to_thread.run_sync(sockowner.find_owner, client_port, server_port, [os.getpid()])
        self.lookups += 1
        self.found += owner is not None
        return owner

    def ended_run(self, origin: object) -> str | None:
        return None


OWNERS = TreeOwners()


async def with_proxy(upstream: str, fn: Any) -> Any:
    usage: list[UsageRecord] = []

    async def on_usage(record: UsageRecord) -> None:
        usage.append(record)

    proxy = ModelProxy(
        {"anthropic": Route("anthropic", upstream)},
        {"ANTHROPIC_API_KEY": KEY},
        Ledger(Budget()),
        current_run=lambda: "run-bench",
        on_usage=on_usage,
        on_exceeded=lambda run_id, ex: None,
        attribution=OWNERS,
    )
    placeholder = proxy.rotate()["ANTHROPIC_API_KEY"]
    await proxy.start()
    await proxy.ready()  # the upstream client's imports and TLS roots are not per-request CPU
    try:
        t_cpu = time.process_time()
        result = await fn(f"{proxy.url}/anthropic", placeholder)
        return result, time.process_time() - t_cpu, len(usage)
    finally:
        await proxy.close()


async def run_client(*args: str) -> Any:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agent_lab.bench.model_proxy", *args, cwd=ROOT, stdout=subprocess.PIPE
    )
    out, _ = await proc.communicate()
    return json.loads(out)


def start(argv: list[str], port_file: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Start an upstream process; its URL once it wrote its port."""
    port_file.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "lab")])}
    proc = subprocess.Popen([sys.executable, *argv, str(port_file)], cwd=ROOT, stdout=subprocess.DEVNULL, env=env)
    for _ in range(400):
        if port_file.exists() and port_file.read_text().strip():
            return proc, f"http://127.0.0.1:{port_file.read_text().strip()}"
        time.sleep(0.05)  # a start-up poll for a port file, not a wait in a measurement
    proc.kill()
    raise RuntimeError(f"{argv} did not start")


async def measure(fake_url: str, blast_url: str, requests: int) -> None:
    for fresh in (False, True):

        async def ttft(url: str, placeholder: str, fresh: bool = fresh) -> Any:
            mode = "fresh" if fresh else "kept"
            return await run_client("--client-ttft", fake_url, url, placeholder, str(requests), mode)

        before = OWNERS.lookups, OWNERS.found
        timings, cpu_s, measured = await with_proxy(fake_url, ttft)
        d, p = timings["direct"], timings["proxied"]
        rows = []
        for q, goal in ((50, 5.0), (95, 15.0)):
            dq, pq = percentile(d, q), percentile(p, q)
            rows.append((f"p{q}", dq, pq, pq - dq, f"<= +{goal:g} ms", "met" if pq - dq <= goal else "NOT met"))
        connections = "a new connection per request" if fresh else "kept-alive connections"
        table(
            f"time to first token, ms ({len(d)} direct / {len(p)} proxied, interleaved; fake Anthropic upstream; "
            f"{connections})",
            ("", "direct", "proxied", "added", "goal", ""),
            rows,
        )
        lookups, found = OWNERS.lookups - before[0], OWNERS.found - before[1]
        print(
            f"proxy CPU {cpu_s * 1000 / max(len(p), 1):.2f} ms per request; {measured} model.usage records; "
            f"{lookups} owner lookups, {found} found"
        )

    direct = await run_client("--client-throughput", blast_url, KEY, "10")

    async def through(url: str, placeholder: str) -> Any:
        return await run_client("--client-throughput", url, placeholder, "10")

    proxied, cpu_s, _ = await with_proxy(blast_url, through)
    throughput_rows: list[tuple[Any, ...]] = [
        ("direct", direct["bytes"] / 1e6, direct["seconds"], direct["bytes"] / 1e6 / direct["seconds"], "-"),
        (
            "proxied",
            proxied["bytes"] / 1e6,
            proxied["seconds"],
            proxied["bytes"] / 1e6 / proxied["seconds"],
            cpu_s / proxied["seconds"] * 100,
        ),
    ]
    table("10 concurrent SSE streams of 8 MB each", ("", "MB", "s", "MB/s", "proxy CPU %"), throughput_rows)


def main(requests: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        fake, fake_url = start(["-c", FAKE_SCRIPT], Path(tmp) / "fake.port")
        try:
            blast, blast_url = start(["-m", "agent_lab.bench.model_proxy", "--blast"], Path(tmp) / "blast.port")
            try:
                asyncio.run(measure(fake_url, blast_url, requests))
            finally:
                blast.kill()
        finally:
            fake.kill()


FAKE_SCRIPT = """
import sys, threading
from agent_lab.testing.fake_anthropic import FakeAnthropic
fake = FakeAnthropic()
open(sys.argv[1], "w").write(str(fake.port))
threading.Event().wait()
"""


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=150)
    parser.add_argument("--client-ttft", nargs=5)
    parser.add_argument("--client-throughput", nargs=3)
    parser.add_argument("--blast")
    args = parser.parse_args()
    if args.client_ttft:
        direct_url, proxied_url, placeholder, n, mode = args.client_ttft
        print(json.dumps(client_ttft(direct_url, proxied_url, placeholder, int(n), mode == "fresh")))
    elif args.client_throughput:
        url, key, streams = args.client_throughput
        print(json.dumps(asyncio.run(client_throughput(url, key, int(streams)))))
    elif args.blast:
        asyncio.run(blast_upstream(args.blast))
    else:
        main(args.requests)
