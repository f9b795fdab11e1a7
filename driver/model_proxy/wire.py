"""Headers either way, and the upstream client's construction (the provider side's HTTP is the
loopback core's, `driver.net.listener`).
"""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import httpx2

# Headers that describe one hop, not the message: never forwarded either way.
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        b"content-length",
        b"accept-encoding",
    }
)
# Where a provider puts its key: Anthropic's x-api-key, Bearer tokens (OpenAI, OAuth), Azure's api-key.
CREDENTIAL_HEADERS = (b"x-api-key", b"authorization", b"api-key")


def new_client(timeout_s: float) -> httpx2.AsyncClient:
    import httpx2

    timeout = httpx2.Timeout(connect=timeout_s, read=None, write=timeout_s, pool=None)
    if any(os.environ.get(name) for name in PROXY_VARIABLES):
        # The sandbox's egress proxy applies to the upstream, as it would to the provider (httpx2 reads
        # the variables, NO_PROXY included, only for a client without its own transport).
        return httpx2.AsyncClient(timeout=timeout, trust_env=True, follow_redirects=False)
    # TCP_NODELAY towards the upstream: httpcore2 writes a request's head and body apart, and anyio's
    # sockets do not set it, so the body would wait ~40 ms for the head's delayed ACK.
    transport = httpx2.AsyncHTTPTransport(socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
    return httpx2.AsyncClient(timeout=timeout, trust_env=True, follow_redirects=False, transport=transport)


PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
