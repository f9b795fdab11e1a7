"""Processes and terminals beside the agent (PROTOCOL §6.8).

`ring` and `text` hold the protocol logic with no I/O (offsets, the ring's arithmetic, replay, UTF-8
framing); `spec` turns a `process.start` into what to execute; `ringfile` is the ring on disk;
`spawn` starts one process (a PTY or pipes) inside the provider's containment; `output` reads a
process's output into its ring and sends it live, paced (its pacing decision free of I/O); `room` is
the kernel's room: the registry (`proc.Proc`), the commands, each process's life and its end.
"""
