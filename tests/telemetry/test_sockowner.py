"""The owner of a loopback connection's client socket, found from /proc (driver/telemetry/sockowner.py):
real sockets, a real child process holding one, no stand-ins."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

from driver.telemetry import sockowner

CHILD = """
import socket, sys
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
print(c.getsockname()[1], flush=True)
sys.stdin.read()
"""


def test_the_child_holding_the_client_socket_is_found_and_only_inside_the_tree() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    before = sockowner.boot_seconds()
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        client_port = int(child.stdout.readline())
        accepted, _ = server.accept()
        # This process, the tree's root and searched first, holds the server's end of the same
        # connection: the client's end is the one found, in the child.
        owner = sockowner.find_owner(client_port, port, [os.getpid()])
        assert owner is not None and owner.pid == child.pid
        # Its start on the boot clock, at the kernel's tick resolution.
        assert before - 0.02 <= owner.started_s <= sockowner.boot_seconds()
        # Outside the given tree: not found (the caller keeps its default).
        assert sockowner.find_owner(client_port, port, [1 << 22]) is None
        started = time.perf_counter()
        sockowner.find_owner(client_port, port, [os.getpid()])
        print(f"lookup {1000 * (time.perf_counter() - started):.2f} ms")
        accepted.close()
    finally:
        child.kill()
        child.wait()
        server.close()
