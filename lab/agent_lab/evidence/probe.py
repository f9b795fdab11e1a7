"""The agent's side of the isolation claim: a tool the model runs that tries to read the driver's
secrets. `python -m agent_lab.evidence.probe DRIVER_PID BOOT_FILE OUT_DIR` (run by the provider's shell
tool) copies whatever it can read of /proc/<driver>/environ, /proc/<driver>/cmdline, the driver's
readable memory (/proc/<driver>/mem at the regions of /proc/<driver>/maps, up to 256 MiB) and the boot
file into OUT_DIR, one file each, or an `.denied` file naming the error. It is given no secret: the
evidence command searches the copies for the token afterwards.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

MEM_CAP = 256 * 2**20


def _save(out: Path, name: str, read: object) -> None:
    try:
        data = read() if callable(read) else b""
        (out / f"{name}.bin").write_bytes(data)
    except OSError as exc:
        (out / f"{name}.denied").write_text(f"{type(exc).__name__}: {exc.strerror}")


def _memory(pid: str) -> bytes:
    chunks: list[bytes] = []
    total = 0
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        for line in maps:
            fields = line.split()
            if "r" not in fields[1] or (len(fields) > 5 and fields[5].startswith("[v")):
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            size = min(end - start, MEM_CAP - total)
            if size <= 0:
                break
            try:
                mem.seek(start)
                chunks.append(mem.read(size))
                total += size
            except OSError:
                continue
    if not chunks:
        raise PermissionError(13, "no region of /proc/PID/mem was readable")
    return b"".join(chunks)


def main(argv: list[str]) -> int:
    pid, boot, out = argv[0], argv[1], Path(argv[2])
    out.mkdir(parents=True, exist_ok=True)
    (out / "uid.txt").write_text(str(os.getuid()))
    _save(out, "environ", lambda: Path(f"/proc/{pid}/environ").read_bytes())
    _save(out, "cmdline", lambda: Path(f"/proc/{pid}/cmdline").read_bytes())
    _save(out, "mem", lambda: _memory(pid))
    _save(out, "boot_file", lambda: Path(boot).read_bytes())
    print("probe done")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
