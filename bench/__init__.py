"""The benchmarks moved into the lab: `python -m agent_lab.bench` (lab/agent_lab/bench/). This package
only keeps `python -m bench [NAME ...]` working from a checkout."""
