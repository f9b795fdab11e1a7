"""The ACP runtime (`acp`): `adapter.AcpAdapter` and its parts (`client`, `models`, `session`, `opening`,
`prompt`, `turn`, `followup`, `permissions`, `fs`, `terminal`, `state`, `resume`, `reattach`). Nothing is
imported here: the registry imports `adapter` only when this runtime is used."""
