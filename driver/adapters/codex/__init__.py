"""The Codex app-server runtime (`openai-app-server`): `adapter.CodexAdapter` and its parts (`config`,
`thread`, `turn`, `steer`, `requests`, `notices`, `files`, `outcome`, `process`). Nothing is imported
here: the registry imports `adapter` only when this runtime is used."""
