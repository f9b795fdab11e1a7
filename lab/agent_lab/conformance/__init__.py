"""A conformance kit for someone else's control plane (issue 35).

`agent-driver controlplane conformance --url ws://... --token-file F --instance ID [--api URL]` plays
a scripted driver against the control plane's link: the handshake, epochs and 4409, batches with
duplicates and resends, partial receipts, commands and their statuses, liveness; and, when the control
plane offers the reference's HTTP routes (`--api`), reads back what it receipted. Each rule is one
line, PASS / FAIL / SKIP with what was seen; the exit status is 1 when any rule fails.
See docs/conformance.md.
"""
