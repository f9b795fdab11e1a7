"""The wire contract as data: boot schema, frames, commands, events, and the sans-I/O link core."""
