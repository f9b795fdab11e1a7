"""An ACP agent runs on the pinned Node (package.json's `node`), not on whatever Node the machine has:
claude-agent-acp declares `node >= 22` and Debian's own Node is older."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.adapters.test_acp import ROOT, make_adapter

PINNED_BIN = ROOT / "node_modules" / ".bin"


def test_a_bare_node_resolves_to_the_pinned_one_first(tmp_path: Path) -> None:
    h = make_adapter(tmp_path, ["node", "--version"])
    env = h.adapter._env()
    argv = h.adapter._argv(env)
    assert argv[0] == str(PINNED_BIN / "node")
    # A `#!/usr/bin/env node` script, and any node the agent starts, finds the same binary first.
    assert env["PATH"].split(os.pathsep)[0] == str(PINNED_BIN)
    pinned = json.loads((ROOT / "package.json").read_text())["dependencies"]["node"]
    shebang = subprocess.run(
        ["/usr/bin/env", "node", "--version"], env={"PATH": env["PATH"]}, capture_output=True, text=True, check=True
    )
    assert shebang.stdout.strip() == f"v{pinned}"
