"""Test support shipped with the driver: fake model endpoints and port doubles for offline runs."""
