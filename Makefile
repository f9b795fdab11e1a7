# Every target works on a fresh machine: `make test` installs what it needs first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP_PY := $(VENV)/.installed
STAMP_NPM := node_modules/.installed
STAMP_DEB := $(VENV)/.debian
STAMP_SYSPY := $(VENV)/.system-python
NODE := node_modules/.bin/node

.PHONY: setup run test test-fast test-provider test-image lint bench evidence clean

setup: $(STAMP_PY) $(STAMP_NPM) $(STAMP_DEB) $(STAMP_SYSPY)

$(STAMP_PY): pyproject.toml lab/pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[telemetry]' -e './lab[test]'
	touch $@

# The pinned Node comes from npm too (package `node`); the check refuses a Node that a runtime's
# `engines` rejects, or a runtime installed at another version than pinned, naming what is wrong.
$(STAMP_NPM): package.json package-lock.json scripts/check-runtimes.mjs
	@command -v npm >/dev/null || { echo "make setup: npm is needed to install the pinned runtimes (Debian: apt-get install npm)" >&2; exit 1; }
	npm install --no-audit --no-fund --loglevel=error
	@test -x $(NODE) || { echo "make setup: the pinned Node did not install ($(NODE) is missing); see package.json" >&2; exit 1; }
	$(NODE) scripts/check-runtimes.mjs
	touch $@

# bubblewrap: codex-acp sandboxes commands with bwrap. chromium + chromium-driver: the console's browser tests.
# postgresql-15: the control plane's PostgreSQL engine (its tests start a throwaway cluster).
$(STAMP_DEB): Makefile | $(STAMP_PY)
	command -v bwrap >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; }
	{ command -v chromium >/dev/null && command -v chromedriver >/dev/null; } || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; }
	{ command -v pg_ctl >/dev/null || ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; } || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql-15 >/dev/null; }
	touch $@

# The image smoke test (tests/image/) makes its venv from Debian's own python3, as the image does.
$(STAMP_SYSPY): | $(STAMP_PY)
	test -x /usr/bin/python3 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 >/dev/null; }
	touch $@

run: setup
	$(BIN)/agent-driver dev

lint: $(STAMP_PY)
	$(BIN)/ruff check driver lab tests bench
	$(BIN)/mypy

# The suite waits on real runtimes far more than it computes: 4 workers on 2 cores (against one
# process: docs/performance.md). tests/conftest.py schedules them: files as units, `serial` tests alone.
TEST_WORKERS ?= 4

test: setup lint
	$(BIN)/pytest -q -p no:cacheprovider -n $(TEST_WORKERS)

test-fast: setup
	$(BIN)/pytest -q -m "not provider and not faults and not image"

test-provider: setup
	$(BIN)/pytest -q -m provider

test-image: setup
	$(BIN)/pytest -q -m image

bench: setup
	$(BIN)/python -m agent_lab.bench

# The five claims, measured (offline: fake model endpoints); the report goes to docs/evidence.md.
evidence: setup
	$(BIN)/agent-driver evidence --json docs/evidence.json --markdown docs/evidence.md

clean:
	rm -rf $(VENV) node_modules
