# agent-driver: the sandbox entrypoint. What this file builds is what `tests/image/` runs on every
# machine, Docker or not: the wheel installed into a venv made from Debian's own python3, the pinned
# runtimes from package.json on the pinned Node, started as uid 10001 with only the ENV below, a
# read-only /opt/agent-driver and a writable /workspace. With a Docker daemon the same test also
# builds and runs this file. Nothing is fetched at run time.
#
# No HEALTHCHECK, by design: the driver serves nothing and listens on no port; it dials out to its
# control plane and sends heartbeats on that one link (PROTOCOL §2.5), so its liveness is judged
# where it is observed, by the control plane. A probe inside the container could only restate that,
# and a failing probe would get a driver restarted that the control plane may still be draining.

ARG DEBIAN=debian:bookworm-slim

# -- build: Debian's node/npm only run the installers; they do not reach the final image ----------
FROM ${DEBIAN} AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      python3 python3-venv nodejs npm ca-certificates \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/agent-driver
# The runtimes and the Node they run on (the npm package `node`), then the same check as `make setup`.
COPY package.json package-lock.json ./
COPY scripts/check-runtimes.mjs scripts/
RUN npm ci --no-audit --no-fund --loglevel=error \
 && node_modules/.bin/node scripts/check-runtimes.mjs \
 && npm prune --omit=dev --no-audit --no-fund --loglevel=error \
 && node_modules/.bin/node --version
# The daemon's wheel only: lab/ (control plane, fakes, evidence, benches) is never copied in.
COPY pyproject.toml README.md LICENSE /src/
COPY driver /src/driver
RUN python3 -m venv /opt/agent-driver/venv \
 && /opt/agent-driver/venv/bin/pip wheel --no-cache-dir --no-deps --wheel-dir /src/dist /src \
 && wheel="$(ls /src/dist/agent_driver-*.whl)" \
 && /opt/agent-driver/venv/bin/pip install --no-cache-dir --no-compile "${wheel}[telemetry]"

# -- the image --------------------------------------------------------------------------------------
FROM ${DEBIAN}
# bubblewrap: codex-acp sandboxes the commands it runs with bwrap.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 bubblewrap ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/agent-driver/node_modules /opt/agent-driver/node_modules
COPY --from=build /opt/agent-driver/venv /opt/agent-driver/venv

# The environment the driver starts with: tests/image/ runs the driver with exactly these (`env -i`).
ENV AGENT_DRIVER_PROJECT_ROOT=/opt/agent-driver \
    PATH=/opt/agent-driver/venv/bin:/opt/agent-driver/node_modules/.bin:/usr/local/bin:/usr/bin:/bin \
    LANG=C.UTF-8

# Kept equal to package.json and pyproject.toml by tests/image/test_files.py.
LABEL org.opencontainers.image.title="agent-driver" \
      io.agent-driver.node="24.21.0" \
      io.agent-driver.runtime.openai-codex="0.171.0" \
      io.agent-driver.runtime.codex-acp="0.16.0" \
      io.agent-driver.runtime.claude-agent-acp="0.101.0" \
      io.agent-driver.runtime.claude-agent-sdk="0.2.189"

RUN useradd --create-home --uid 10001 --user-group agent \
 && mkdir -p /workspace /run/agent-driver \
 && chown agent:agent /workspace /run/agent-driver \
 && chmod 0700 /run/agent-driver
USER 10001:10001
VOLUME ["/workspace"]
WORKDIR /workspace
ENTRYPOINT ["agent-driver", "run"]
