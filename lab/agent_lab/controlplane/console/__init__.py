"""The web console of the reference control plane: one static page served at `/` of the HTTP API port.

The page reads only what the store committed (a Server-Sent Events stream per instance, resumable by
`Last-Event-ID` = the last event `seq` it showed) and acts only through stored commands, so what it
shows is what a real control plane would know. Modules: `config` (what to serve and to whom), `auth`
(the console token), `httpio` (the minimal HTTP/1.1 reading and writing), `routes` (the console's
own routes), `stream` (the SSE stream), `views` (instance summaries), `files` (uploads and artifact
downloads). The page itself is `static/` (no build step, no network).
"""

from agent_lab.controlplane.console.config import ConsoleConfig, is_loopback

__all__ = ["ConsoleConfig", "is_loopback"]
