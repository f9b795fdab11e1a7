# agent-driver: the sandbox entrypoint. Provider runtimes are installed at build time by the same
# steps as `make setup` (pinned npm packages, Python dependencies, bubblewrap); nothing is fetched
# at run time.
FROM python:3.11-slim

RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends nodejs npm bubblewrap make ca-certificates \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/agent-driver
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund --loglevel=error && touch node_modules/.installed
COPY pyproject.toml README.md LICENSE ./
COPY driver ./driver
RUN pip install --no-cache-dir ".[telemetry]"

ENV AGENT_DRIVER_PROJECT_ROOT=/opt/agent-driver
RUN useradd --create-home --uid 10001 agent && mkdir -p /workspace && chown agent:agent /workspace
USER agent
VOLUME ["/workspace"]
WORKDIR /workspace
ENTRYPOINT ["agent-driver", "run"]
