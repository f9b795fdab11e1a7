"""What the runtimes' adapters share: the adapter contract (`base`), JSON-RPC over stdio (`jsonrpc`), the
provider's process and environment (`process`, `environment`), the first input's attachments and
instructions, the host MCP server (`host_server`), a provider under a keeper (`keeping`), what a
`file.changed` says (`changed_files`) and the protocol diagnostics. No module here imports a runtime's
package. Nothing is imported here."""
