"""Ports the kernel offers adapters: permissions, host tools, files (events live in the kernel)."""
