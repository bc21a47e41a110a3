# projector: the commands of DESIGN §7. Everything is installed by these rules, nothing by hand.
SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

UV_VERSION := 0.13.8
TOOLS := .local/tools
UV := $(TOOLS)/bin/uv
PY := .venv/bin/python
export UV_PYTHON_DOWNLOADS := never
export UV_PYTHON := python3.11

.PHONY: help install binaries test unit integration lint fmt demo bench bench-quick clean

help: ## list the commands
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

$(UV):
	python3 -m venv $(TOOLS)
	$(TOOLS)/bin/pip install -q --disable-pip-version-check uv==$(UV_VERSION)

.venv/.synced: pyproject.toml uv.lock | $(UV)
	$(UV) sync --frozen --quiet
	touch $@

install: .venv/.synced ## create .venv from the lock file

# The controller's runtime dependencies only, as a deployment has them: benchmarks run the
# controller from here so that its memory is not inflated by test and lint tools.
.local/prod-venv/.synced: pyproject.toml uv.lock | $(UV)
	UV_PROJECT_ENVIRONMENT=.local/prod-venv $(UV) sync --frozen --no-dev --quiet
	touch $@

binaries: ## build (or reuse) etcd, kube-apiserver, kube-controller-manager
	tests/controlplane/build.sh >/dev/null

test: install binaries lint ## everything: lint, unit and integration tests (real API server)
	$(PY) -m pytest

unit: install ## pure tests only, no server
	$(PY) -m pytest tests/unit

integration: install binaries ## tests against the local control plane
	$(PY) -m pytest tests/integration

lint: install ## ruff, mypy --strict, import-linter contracts
	.venv/bin/ruff check --output-format concise .
	.venv/bin/ruff format --check .
	.venv/bin/mypy
	.venv/bin/lint-imports

fmt: install
	.venv/bin/ruff check --fix .
	.venv/bin/ruff format .

demo: install binaries ## start a local control plane and watch a projection happen
	$(PY) -m tests.demo

bench: install binaries .local/prod-venv/.synced ## every benchmark at DESIGN §8 sizes; results/*.json + docs/benchmarks.md
	$(PY) -m benchmarks full
	$(PY) -m benchmarks.report

bench-quick: install binaries .local/prod-venv/.synced ## the same benchmarks at small sizes, into benchmarks/results-quick/
	$(PY) -m benchmarks quick --out benchmarks/results-quick
	$(PY) -m benchmarks.report --results benchmarks/results-quick --target benchmarks/results-quick/benchmarks.md

clean: ## remove local state (the binary cache outside the repo is kept)
	-$(PY) -m tests.controlplane down
	rm -rf .local/cluster .local/kubeconfig

include mk/cluster.mk
