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

.PHONY: help install binaries helm registry release registry-up registry-down prometheus otelcol manifests docs image generate observability-docs traces-docs reliability-docs test fuzz compat unit integration harness lint fmt demo bench bench-quick clean \
  cluster-up cluster-down kind-up kind-down node-packages node-binaries node-up node-down

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

binaries: ## build (or reuse) etcd, kube-apiserver, -controller-manager, -scheduler, kubelet, kubectl
	tests/bed/controlplane/build.sh >/dev/null

helm: ## build (or reuse) helm from its Go module (tests/bed/helm/build.sh; cold: ~11 min)
	tests/bed/helm/build.sh >/dev/null

manifests: install helm ## regenerate deploy/install.yaml, deploy/crds, deploy/rbac, docs/reference from the chart
	$(PY) -m tests.bed.helm.chart

docs: install ## build the docs site (mkdocs-material, --strict) into .local/site
	.venv/bin/mkdocs build --strict --site-dir .local/site

# The image: with a running Docker or Podman engine if there is one (a docker CLI without a daemon
# counts as none), else with buildah, daemonless (`--isolation chroot`), from a local Python base
# made by debootstrap (no registry needed; tests/bed/node/images.py). buildah's storage and config
# stay under .local/buildah. When a node runs (`make node-up`), the image is imported into it.
# CONTAINER_ENGINE=docker|podman|buildah picks one explicitly.
IMAGE ?= localhost/projector:dev
CONTAINER_ENGINE ?=
image: install ## build the controller image (Docker/Podman if running, else buildah) as $(IMAGE)
	@engine="$(CONTAINER_ENGINE)"; \
	if [ -z "$$engine" ]; then \
	  for e in docker podman; do \
	    if command -v $$e >/dev/null 2>&1 && timeout 20 $$e info >/dev/null 2>&1; then engine=$$e; break; fi; \
	  done; \
	fi; \
	if [ -z "$$engine" ] || [ "$$engine" = buildah ]; then \
	  $(MAKE) -s node-packages; \
	  echo "make image: building $(IMAGE) with buildah (no Docker or Podman engine runs here)"; \
	  $(PY) -m tests.bed.node image --image $(IMAGE); \
	else \
	  echo "make image: building $(IMAGE) with $$engine"; \
	  $$engine build -t $(IMAGE) .; \
	fi

prometheus: ## build (or reuse) prometheus and promtool from their Go module
	tests/bed/prometheus/build.sh >/dev/null

registry: ## build (or reuse) the test bed's OCI registry from its Go module (tests/bed/registry)
	tests/bed/registry/build.sh >/dev/null

# make release: the image (buildah, as make image), its SBOM and the chart, pinned by digest, pushed
# to REGISTRY (host[:port] of an OCI registry; default: the one `make registry-up` runs).
REGISTRY ?=
release: install helm registry node-packages ## build and push the image, its SBOM and the chart (version from pyproject.toml, notes from CHANGELOG.md) to REGISTRY
	$(PY) -m tests.bed.release $(if $(REGISTRY),--registry $(REGISTRY))

registry-up: install registry ## start (or reuse) a local OCI registry on loopback; .local/registry.env
	$(PY) -m tests.bed.registry up

registry-down: install ## stop the local OCI registry (what it held goes with it)
	$(PY) -m tests.bed.registry down

otelcol: ## build (or reuse) the OpenTelemetry Collector the tracing tests export to (tests/bed/otel/build.sh)
	tests/bed/otel/build.sh >/dev/null

generate: install ## rewrite docs/metrics.md, the dashboard and the alert rules from tests/bed/observability/
	$(PY) -m tests.bed.observability

observability-docs: install binaries prometheus ## redraw docs/observability.md from a real Prometheus run (its long scenario: ~6 min)
	PROJECTOR_UPDATE_DOCS=1 PROJECTOR_LONG_FAULTS=1 $(PY) -m pytest -q tests/integration/test_observability.py

traces-docs: install binaries otelcol ## rewrite the traces section of docs/observability.md from a real collector
	PROJECTOR_UPDATE_DOCS=1 $(PY) -m pytest -q tests/integration/test_tracing.py

reliability-docs: install binaries ## rerun every fault test (-m fault, the minutes-long ones too) and rewrite docs/reliability.md
	PROJECTOR_UPDATE_DOCS=1 PROJECTOR_LONG_FAULTS=1 $(PY) -m pytest -q -m fault tests/integration


# Two pytest-xdist workers, each with its own control plane: most of a test's time is waiting
# on the API server and the controller, so two halve the wall time on two cores. The node tier
# runs after, alone: a machine runs one node at a time (xdist_group did not hold the node tests
# to one worker here: pytest-xdist 3.8 on pytest 9.2 split them twice).
TEST_WORKERS ?= 2
test: install binaries helm registry prometheus otelcol node-binaries lint docs ## everything: lint, docs, unit, integration and node tests (real API server, real node, real collector)
	$(PY) -m pytest -n $(TEST_WORKERS) -m "not node and not serial" --durations=25
	$(PY) -m pytest -m "node or serial" --durations=10

# The CRD (schema, CEL rules, defaults, printer columns), admission (the chart's
# ValidatingAdmissionPolicy, strict field validation) and DESIGN §3 semantics tests, on each
# KUBE_COMPAT_VERSIONS entry: a control plane built from that version's module (no kubelet or
# kubectl: no node runs). Cold, each version builds for about 17 minutes on 2 cores.
COMPAT_TESTS := tests/harness/test_control_plane.py::test_version_is_pinned \
  $(addprefix tests/integration/,test_crd.py test_validate.py test_helm.py test_rows.py test_safety.py test_consent.py)
compat: install helm ## the CRD, admission and semantics tests on the oldest and newest Kubernetes the chart supports
	source tests/bed/controlplane/versions.env; for v in $$KUBE_COMPAT_VERSIONS; do \
	  echo "== Kubernetes $$v"; \
	  PROJECTOR_KUBE_VERSION=$$v PROJECTOR_KUBE_CMDS="kube-apiserver kube-controller-manager kube-scheduler" \
	    $(PY) -m pytest -q $(COMPAT_TESTS); \
	done

unit: install ## pure tests only, no server
	$(PY) -m pytest tests/unit

integration: install binaries helm prometheus otelcol ## the product's tests against the local control plane
	$(PY) -m pytest tests/integration

# Model-based testing for a long budget (tests/integration/test_model_based.py): fresh seeds
# (or one SEED=) of OPS random operations each, with the FAULTS of kill,watch,blackhole,apiserver,
# until DURATION seconds have passed; a failure is shrunk (for up to SHRINK seconds) and printed
# as a regression case. The summary goes to .local/fuzz/; UPDATE_DOCS=1 renders it into
# docs/reliability.md. make test runs the same test with fixed seeds and a small budget.
SEED ?=
OPS ?= 150
FAULTS ?= kill,watch,blackhole,apiserver
DURATION ?= 900
SHRINK ?= 900
fuzz: install binaries ## random operations and faults against the real API server, judged by an oracle of DESIGN §3 (SEED= OPS= FAULTS= DURATION=)
	PROJECTOR_FUZZ=1 SEED=$(SEED) OPS=$(OPS) FAULTS=$(FAULTS) DURATION=$(DURATION) SHRINK=$(SHRINK) \
	  $(PY) -m pytest -q tests/integration/test_model_based.py::test_fuzz
	$(if $(UPDATE_DOCS),$(PY) -m tests.model.report $$(ls -t .local/fuzz/fuzz-*.json | head -1))

harness: install binaries ## tests of the control plane, demo and benchmark harness
	$(PY) -m pytest tests/harness

lint: install ## ruff, mypy --strict, import-linter contracts
	.venv/bin/ruff check --output-format concise .
	.venv/bin/ruff format --check .
	.venv/bin/mypy
	.venv/bin/lint-imports

fmt: install
	.venv/bin/ruff check --fix .
	.venv/bin/ruff format .

demo: install binaries ## start a local control plane and watch a projection happen
	$(PY) -m tests.bed.demo

# The rotation-to-pod benchmark needs the one real node of this machine: NODE_LOCK (a flock
# file, e.g. a shared machine's node slot) queues it behind other users of the node.
NODE_LOCK ?=
bench: install binaries .local/prod-venv/.synced node-binaries ## every benchmark at DESIGN §8 sizes; results/*.json + docs/benchmarks.md, docs/scaling.md
	$(PY) -m benchmarks full
	$(if $(NODE_LOCK),flock $(NODE_LOCK)) $(PY) -m benchmarks.pod_latency --rotations 30
	$(PY) -m benchmarks.report

bench-quick: install binaries .local/prod-venv/.synced ## the same benchmarks at small sizes, into benchmarks/results-quick/
	$(PY) -m benchmarks quick --out benchmarks/results-quick
	$(PY) -m benchmarks.report --results benchmarks/results-quick --target benchmarks/results-quick/benchmarks.md

clean: ## remove local state (the binary cache outside the repo is kept)
	-$(PY) -m tests.bed.node down
	-$(PY) -m tests.bed.registry down
	-$(PY) -m tests.bed.controlplane down
	rm -rf .local/cluster .local/kubeconfig .local/node .local/node.env .local/images

# Local clusters.
# cluster-*: etcd + kube-apiserver + kube-controller-manager on loopback (tests/bed/controlplane);
# kind-*: a kind cluster for users with a Docker engine (tests/kind). Kubeconfigs go to .local/.
cluster-up: install ## start (or reuse) the local control plane; admin kubeconfig in .local/kubeconfig
	$(PY) -m tests.bed.controlplane up

cluster-down: install ## stop the local control plane
	$(PY) -m tests.bed.controlplane down

kind-up: ## create (or reuse) kind cluster "projector" (needs Docker); .local/kind-kubeconfig
	tests/bed/kind/kind.sh up

kind-down: ## delete the kind cluster
	tests/bed/kind/kind.sh down

# The local node: kubelet + containerd + runc joined to the local control plane (tests/bed/node).
# Debian's packages come from this rule, never by hand: apt-get as root, only the missing ones,
# so a second run does nothing.
NODE_PACKAGES := runc umoci skopeo buildah debootstrap containernetworking-plugins busybox-static gcc libc6-dev iproute2 iptables nftables

node-packages: ## install (only if missing) Debian's runc, umoci, skopeo, buildah, debootstrap, CNI plugins, busybox
	@missing=$$(for p in $(NODE_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ]; then echo "make node-packages: not root, cannot install $$missing (apt-get); the node tier will skip, saying so" >&2; exit 0; fi; \
	  echo "make node-packages: installing $$missing"; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing >/dev/null \
	    || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing >/dev/null; }; \
	fi

node-binaries: node-packages ## build (or reuse) kubelet, containerd (+shim, ctr) and the pause binary
	tests/bed/node/build.sh >/dev/null

node-up: install binaries node-binaries ## start (or reuse) the control plane and a node; .local/node.env
	$(PY) -m tests.bed.node up

node-down: install ## stop the node (and put back everything it changed on the host)
	$(PY) -m tests.bed.node down
