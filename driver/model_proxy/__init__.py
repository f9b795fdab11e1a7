"""The model proxy (PROTOCOL §6.7): model credentials stay outside the agent.

Imported only when `execution.model_proxy` is set. A loopback HTTP/1.1 server (h11 on asyncio
streams) takes the provider's model requests, checks the placeholder it was given in place of each
secret, swaps in the secret for the upstream's own auth header, forwards with httpx2 and streams the
answer back byte for byte; it reads the usage each answer reports (`usage`), prices it (`prices`) and
enforces the budgets (`budget`). `plan` says how each runtime is pointed at the proxy; `room` is the
kernel's side.
"""
