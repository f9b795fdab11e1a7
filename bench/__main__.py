"""`python -m bench [NAME ...]` from a checkout: the same as `python -m agent_lab.bench [NAME ...]`."""

from __future__ import annotations

import sys

from agent_lab.bench.__main__ import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
