"""Load examples/minimal_cp.py (a script, not a package) for the tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
PATH = ROOT / "examples" / "minimal_cp.py"


def load() -> ModuleType:
    if "minimal_cp" in sys.modules:
        return sys.modules["minimal_cp"]
    spec = importlib.util.spec_from_file_location("minimal_cp", PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["minimal_cp"] = module
    spec.loader.exec_module(module)
    return module
