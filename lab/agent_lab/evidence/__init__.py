"""`agent-driver evidence`: the five claims a durable agent runtime must prove, measured (issue 10).

One module per claim collects observations by driving the real driver process, the real provider
runtimes (offline, against the fake model endpoints) and the reference control plane through failures;
`checks` turns observations into verdicts without I/O; `report` and `render` shape the result.
"""
