"""Benchmarks of agent-driver (`make bench`, `python -m agent_lab.bench [NAME ...]`).

Each prints its figures beside a baseline measured in the same run, and says whether each goal was
met; a goal not met is reported, not raised. A benchmark fails (nonzero exit) only when it crashes.
"""
