"""`agent-driver dev`: placeholder replaced by the interactive chat (in progress)."""

from __future__ import annotations

import argparse
import sys


def main(args: argparse.Namespace) -> int:
    print("agent-driver dev: the interactive chat is not built yet", file=sys.stderr)
    return 1
