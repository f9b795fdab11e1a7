"""agent-driver: the in-sandbox daemon between a provider runtime and its control plane."""

__version__ = "0.1.0"
