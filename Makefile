# Every target works on a fresh machine: `make test` installs what it needs first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP_PY := $(VENV)/.installed
STAMP_NPM := node_modules/.installed
STAMP_DEB := $(VENV)/.debian

.PHONY: setup run test test-fast test-provider lint bench evidence clean

setup: $(STAMP_PY) $(STAMP_NPM) $(STAMP_DEB)

$(STAMP_PY): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

$(STAMP_NPM): package.json
	npm install --no-audit --no-fund --loglevel=error
	touch $@

# bubblewrap: codex-acp sandboxes commands with bwrap.
$(STAMP_DEB): | $(STAMP_PY)
	command -v bwrap >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; }
	touch $@

run: setup
	$(BIN)/agent-driver dev

lint: $(STAMP_PY)
	$(BIN)/ruff check driver tests bench
	$(BIN)/mypy

test: setup lint
	$(BIN)/pytest -q -p no:cacheprovider

test-fast: setup
	$(BIN)/pytest -q -m "not provider and not faults"

test-provider: setup
	$(BIN)/pytest -q -m provider

bench: setup
	$(BIN)/python -m bench

# The five claims, measured (offline: fake model endpoints); the report goes to docs/evidence.md.
evidence: setup
	$(BIN)/agent-driver evidence --json evidence.json --markdown docs/evidence.md

clean:
	rm -rf $(VENV) node_modules
