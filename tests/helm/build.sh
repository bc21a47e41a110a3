#!/usr/bin/env bash
# Build helm from its published Go module (helm.sh/helm/v3) into the cache outside the repository,
# keyed by version, exactly as tests/controlplane/build.sh builds the control plane. A lock keeps
# two concurrent runs (two worktrees, two make jobs) from building into each other; a second run
# finds the binary and prints its path at once.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../controlplane/versions.env
source "$here/../controlplane/versions.env"
cache="${PROJECTOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/projector}"
bin="$cache/bin/helm-$HELM_VERSION"
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
mkdir -p "$bin" "$cache/src"

log() { printf '[helm] %s\n' "$*" >&2; }
fail() { log "FAILED: $*"; exit 1; }

if [[ ! -x "$bin/helm" ]]; then
  exec 9>"$cache/src/helm-$HELM_VERSION.lock"
  flock 9
fi
if [[ ! -x "$bin/helm" ]]; then
  start=$(date +%s)
  work="$cache/src/helm-$HELM_VERSION"
  mkdir -p "$work"
  (
    cd "$work"
    if [[ ! -f go.sum ]]; then
      rm -f go.mod
      go mod init projector.invalid/tools/helm >/dev/null 2>&1
      go mod edit -go=1.26.0 -require="helm.sh/helm/v3@$HELM_VERSION"
      printf '//go:build tools\n\npackage tools\n\nimport _ "helm.sh/helm/v3/cmd/helm"\n' > tools.go
      go mod tidy >/dev/null || fail "go mod tidy in $work"
    fi
    # As helm's own Makefile: the default Kubernetes version (of `helm template` and `lint`) is
    # the one of the client-go it is built with, major + 1 (v0.35 -> 1.35).
    read -r kmaj kmin _ <<<"$(go list -m -f '{{.Version}}' k8s.io/client-go | tr -d v | tr . ' ')"
    local_ld="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
    local_ld+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
    for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
      local_ld+=" -X $pkg.k8sVersionMajor=$((kmaj + 1)) -X $pkg.k8sVersionMinor=$kmin"
    done
    log "building helm $HELM_VERSION (cold: about 11 minutes on 2 shared cores)"
    go build -trimpath -ldflags "$local_ld" -o "$bin/helm.tmp" helm.sh/helm/v3/cmd/helm
  ) || fail "go build helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  mv "$bin/helm.tmp" "$bin/helm"
  log "helm $HELM_VERSION built in $(( $(date +%s) - start ))s"
fi
echo "$bin/helm"
