"""The minimal dialer: the cold-start baseline (issue 10, "performance goals restated").

`python -m agent_lab.evidence.dialer URL INSTANCE EPOCH` with the token in the environment variable
EVIDENCE_DIALER_TOKEN (never in argv). It imports what the driver's link imports (the `websockets`
asyncio client, `msgspec`, `anyio`) and the card's logger (`structlog`, configured and used as a
dialer written on this card would: one line per dial, here below its level, so nothing is written),
dials the same control plane with the same subprotocol and headers, sends one `hello`, waits for
`welcome` and exits: the least a driver process must do before the control plane hears from it. It
deliberately imports nothing else from this package.

Why structlog is in the baseline (issue 26): the card names it as the daemon's logger, and its import
(~20-25 ms on a quiet core, structlog 26's `__init__` loads its dev renderer and stdlib bridge whatever
one uses) is a cost any daemon on this card pays before its first line; the goal measures what the
driver adds beyond such a dialer.
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str]) -> int:
    import anyio
    import msgspec
    import structlog
    from websockets.asyncio.client import connect

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))  # warning and above
    log = structlog.get_logger("dialer")

    url, instance, epoch = argv[0], argv[1], int(argv[2])
    token = os.environ.pop("EVIDENCE_DIALER_TOKEN")

    async def dial() -> None:
        headers = {"Authorization": f"Bearer {token}", "Agent-Driver-Instance": instance}
        async with connect(url, subprotocols=["agent-driver.v1"], additional_headers=headers) as ws:  # type: ignore[list-item]
            hello = {
                "type": "hello",
                "protocol": 1,
                "driver_instance_id": instance,
                "epoch": epoch,
                "driver_version": "dialer",
                "pid": os.getpid(),
                "runtime": "acp",
                "revision": "rev-dialer",
                "session_kind": "cattle",
                "capabilities": [],
                "last_command_seq": 0,
                "outbox": {"lossless_pending": 0, "oldest_pending_seq": None},
                "started_at": "1970-01-01T00:00:00.000Z",
            }
            await ws.send(msgspec.json.encode(hello).decode())
            log.info("dialer.hello_sent", instance=instance)
            await ws.recv()  # the welcome

    anyio.run(dial)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
