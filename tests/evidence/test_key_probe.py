"""The model-key probe finds a key where one is: in its environment, in a child's environ, in a file
(so the isolation claim's model-key row can fail)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from agent_lab.evidence import key_probe
from agent_lab.evidence.checks import token_findings

KEY = "sk-probe-test-key-0123456789abcdef"


def test_the_probe_dumps_env_other_processes_and_files(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "deep").mkdir(parents=True)
    (root / "deep" / "config.json").write_text(f'{{"key": "{KEY}-file"}}')
    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env={"HELD": f"{KEY}-proc"})
    try:
        subprocess.run(
            [sys.executable, key_probe.__file__, str(out), str(root)],
            env={"MY_KEY": f"{KEY}-env", "PATH": "/usr/bin:/bin"},
            check=True,
            capture_output=True,
            timeout=60,
        )
    finally:
        holder.kill()
        holder.wait()
    dumps = {name: (out / f"{name}.bin").read_bytes() for name in ("env", "proc_environ", "files")}
    assert token_findings({"env": dumps["env"]}, f"{KEY}-env") == {"env": "FOUND"}
    assert token_findings({"proc": dumps["proc_environ"]}, f"{KEY}-proc") == {"proc": "FOUND"}
    assert token_findings({"files": dumps["files"]}, f"{KEY}-file") == {"files": "FOUND"}
