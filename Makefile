# kneepoint developer entry points. `make demo` and `make test` are the README's two commands;
# both work on a fresh machine: they create .venv, install the pinned dependencies, and the
# sandbox builds its control-plane binaries into ~/.cache/kneepoint on first use.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-12)

.PHONY: demo test unit integration lint sandbox-up sandbox-down clean-venv

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	@rm -f $(VENV)/.installed-* && touch $(STAMP)

## demo: bring up the sandbox, run the operator, apply deploy/examples/experiment.yaml, watch it decide;
## it removes what it started at the end (make demo DEMO_ARGS=--keep leaves it running)
demo: $(STAMP)
	$(BIN)/kneepoint demo $(DEMO_ARGS)

## test: the whole suite (unit, contract, integration in the sandbox, reduced benchmarks)
test: $(STAMP)
	$(BIN)/lint-imports --no-cache
	$(BIN)/python -m pytest -q -ra tests

unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit tests/contract

integration: $(STAMP)
	$(BIN)/python -m pytest -q -ra tests/integration

lint: $(STAMP)
	$(BIN)/lint-imports --no-cache

sandbox-up: $(STAMP)
	$(BIN)/kneepoint sandbox up

sandbox-down: $(STAMP)
	$(BIN)/kneepoint sandbox down

clean-venv:
	rm -rf $(VENV)
