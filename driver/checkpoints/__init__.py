"""Native checkpoints (PROTOCOL §8.1): the provider's session files sent through the outbox after every
run and at `session.stop`, and restored in a new sandbox from `execution.native_checkpoint`."""
