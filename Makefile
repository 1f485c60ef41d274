# kneepoint developer entry points. `make demo` and `make test` are the README's two commands;
# both work on a fresh machine: they create .venv, install the locked dependencies, and the
# sandbox builds its control-plane binaries into ~/.cache/kneepoint on first use.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The lock files (requirements/lock.py writes them): exact versions and hashes of every
# distribution, transitive ones included; the images install from the same files.
LOCKS := requirements/build.txt requirements/test.txt
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml $(LOCKS) | sha256sum | cut -c1-12)

.PHONY: demo test unit contract integration lint images sandbox-up sandbox-down clean-venv

# pip, setuptools and wheel first (pinned), then the locked set, then kneepoint itself
# without dependencies or build isolation: nothing unlocked is installed; pip check proves
# the lock complete.
$(STAMP): pyproject.toml $(LOCKS)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --require-hashes --no-deps -r requirements/build.txt
	$(BIN)/python -m pip install --quiet --require-hashes --no-deps -r requirements/test.txt
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	$(BIN)/python -m pip check
	@rm -f $(VENV)/.installed-* && touch $(STAMP)

## demo: bring up the sandbox, run the operator, apply deploy/examples/experiment.yaml, watch it decide;
## it removes what it started at the end (make demo DEMO_ARGS=--keep leaves it running)
demo: $(STAMP)
	$(BIN)/kneepoint demo $(DEMO_ARGS)

## test: lint, then the whole suite (unit, contract, integration in the sandbox, reduced benchmarks)
test: lint
	$(BIN)/python -m pytest -q -ra tests

## unit: the fast loop: everything but the sandbox and the tests that build (helm, the wheel)
unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit tests/contract tests/images -m "not build"

## contract: the contract tests that build: the chart rendered by the pinned helm, the wheel
contract: $(STAMP)
	$(BIN)/python -m pytest -q -ra tests/contract tests/images -m build

integration: $(STAMP)
	$(BIN)/python -m pytest -q -ra tests/integration

## lint: import contracts, ruff (lint and format) and mypy, configured in pyproject.toml
lint: $(STAMP)
	$(BIN)/lint-imports --no-cache
	$(BIN)/ruff check
	$(BIN)/ruff format --check
	$(BIN)/mypy

## images: build both images with buildah on a debootstrap Debian base, run them as the
## cluster does (non-root, read-only root filesystem), print their sizes (docs/install.md).
## Needs root; installs buildah, debootstrap and runc with apt-get when missing.
images:
	$(PYTHON) docker/images.py

sandbox-up: $(STAMP)
	$(BIN)/kneepoint sandbox up

sandbox-down: $(STAMP)
	$(BIN)/kneepoint sandbox down

clean-venv:
	rm -rf $(VENV)
