"""The driver's network I/O around sans-I/O cores: `link` dials the control plane (its decisions are
`driver.protocol.link.LinkCore`'s), `listener` is the one hardened loopback HTTP server core the model
proxy and the host MCP server stand on. Nothing is imported here."""
