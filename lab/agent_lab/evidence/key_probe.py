"""The agent's side of the model-key row of the isolation claim (PROTOCOL §6.7): a tool the model runs
that collects everything it can read where a key could be. `python -m agent_lab.evidence.key_probe
OUT_DIR ROOT...` (run by the provider's shell tool) writes into OUT_DIR: `env.bin` (its own
environment), `proc_environ.bin` (every /proc/<pid>/environ it can read, each prefixed by its pid),
`files.bin` (every readable regular file under each ROOT and $HOME, up to 4 MiB each and 256 MiB in
all, each prefixed by its path) and `summary.json` (counts). It is given no secret: the evidence
command searches the copies for the key afterwards.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

FILE_CAP = 4 * 2**20
TOTAL_CAP = 256 * 2**20


def main(argv: list[str]) -> int:
    out = Path(argv[0]).resolve()
    out.mkdir(parents=True, exist_ok=True)
    env = b"\0".join(f"{k}={v}".encode(errors="replace") for k, v in os.environ.items())
    (out / "env.bin").write_bytes(env)
    readable, refused = 0, 0
    with (out / "proc_environ.bin").open("wb") as dump:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                data = Path(f"/proc/{entry}/environ").read_bytes()
            except OSError:
                refused += 1
                continue
            readable += 1
            dump.write(f"\n--- pid {entry}\n".encode() + data)
    roots = [Path(r) for r in argv[1:]] + ([Path(os.environ["HOME"])] if os.environ.get("HOME") else [])
    files, total, seen = 0, 0, set()
    with (out / "files.bin").open("wb") as dump:
        for root in roots:
            for dirpath, dirnames, names in os.walk(root):
                if Path(dirpath).resolve() == out:
                    dirnames[:] = []
                    continue
                for name in names:
                    path = Path(dirpath) / name
                    try:
                        real = path.resolve()
                        if real in seen or not real.is_file() or total >= TOTAL_CAP:
                            continue
                        seen.add(real)
                        with real.open("rb") as f:
                            data = f.read(FILE_CAP)
                    except OSError:
                        continue
                    files += 1
                    total += len(data)
                    dump.write(f"\n--- {path}\n".encode(errors="replace") + data)
    summary = {"environ_readable": readable, "environ_refused": refused, "files_read": files, "bytes_read": total}
    (out / "summary.json").write_text(json.dumps(summary))
    print("key probe done", json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
