"""The keeper's family (PROTOCOL §8.2, docs/keeper.md): the keeper process itself (`keeper.py`, run as a
stdlib-only script under `python -I`), how the driver starts one (`launch`), the files it leaves under
`state_dir/driver/keeper/` (`state`), the kept provider seen from the driver (`kept`), the reattach plan
and gate of a new driver process (`reattach`), and `run --handover` (`handover`).

Nothing is imported here: `import driver.keeper.state` costs only that module."""
