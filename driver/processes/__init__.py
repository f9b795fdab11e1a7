"""Processes and terminals beside the agent (PROTOCOL §6.8).

`ring` and `text` hold the protocol logic with no I/O (offsets, the ring's arithmetic, replay, UTF-8
framing); `spec` turns a `process.start` into what to execute; `ringfile` is the ring on disk;
`spawn` starts one process (a PTY or pipes) inside the provider's containment; `room` is the kernel's
room: the registry, the commands, the read loops and the events.
"""
