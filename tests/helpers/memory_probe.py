"""Run as the driver's own uid: try to read the driver's secrets. Prints one JSON object.

Usage: memory_probe.py PID TOKEN
"""

from __future__ import annotations

import ctypes
import json
import os
import sys

PTRACE_ATTACH, PTRACE_DETACH = 16, 17


def read_environ(pid: int, token: str) -> str:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            data = f.read()
    except OSError as exc:
        return f"denied: {exc.strerror}"
    return "readable, token found" if token.encode() in data else "readable"


def read_mem(pid: int, token: str) -> str:
    try:
        mem = open(f"/proc/{pid}/mem", "rb")  # noqa: SIM115 - closed below
    except OSError as exc:
        return f"denied: {exc.strerror}"
    readable = 0
    with mem, open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            fields = line.split()
            if "r" not in fields[1]:
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            try:
                mem.seek(start)
                chunk = mem.read(min(end - start, 256 * 1024 * 1024))
            except OSError:
                continue
            readable += 1
            if token.encode() in chunk:
                return "readable, token found"
    return f"readable ({readable} regions), token not found" if readable else "denied: no region readable"


def attach(pid: int) -> str:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    if libc.ptrace(PTRACE_ATTACH, pid, None, None) != 0:
        return f"denied: {os.strerror(ctypes.get_errno())}"
    os.waitpid(pid, 0x40000000)  # __WALL: the stop that PTRACE_ATTACH causes
    libc.ptrace(PTRACE_DETACH, pid, None, None)
    return "attached"


def main() -> None:
    pid, token = int(sys.argv[1]), sys.argv[2]
    print(
        json.dumps(
            {
                "uid": os.getuid(),
                "environ": read_environ(pid, token),
                "mem": read_mem(pid, token),
                "ptrace": attach(pid),
            }
        )
    )


if __name__ == "__main__":
    main()
