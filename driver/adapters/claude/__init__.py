"""The Claude Agent SDK runtime (`claude-agent-sdk`): `adapter.ClaudeAdapter` and its parts (`options`,
`command`, `cli`, `client`, `control`, `messages`, `turn`, `permissions`, `setup`, `outcome`). Nothing is
imported here: the registry imports `adapter` only when this runtime is used, and the adapter never
imports `claude_agent_sdk` or `mcp` (tests/adapters/test_registry.py)."""
