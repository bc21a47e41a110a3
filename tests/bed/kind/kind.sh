#!/usr/bin/env bash
# kind (Kubernetes in Docker), the path for users who have Docker: `make kind-up` / `make kind-down`.
#
#   tests/bed/kind/kind.sh build   # build the pinned kind; prints its path as the last stdout line
#   tests/bed/kind/kind.sh up      # create (or reuse) cluster "projector"; kubeconfig in .local/
#   tests/bed/kind/kind.sh down    # delete it
#
# kind is built from its Go module (KIND_VERSION in ../controlplane/versions.env) in a small wrapper
# module, like the control-plane binaries, into the same cache; never installed system-wide.
# shellcheck source=../gobuild.sh
source "$(dirname "${BASH_SOURCE[0]}")/../gobuild.sh" kind
repo="$(cd "$here/../.." && pwd)"
bin="$cache/bin/kind-$KIND_VERSION"
cluster="${KIND_CLUSTER_NAME:-projector}"
kubeconfig="${KIND_KUBECONFIG:-$repo/.local/kind-kubeconfig}"

build() {
  if [[ ! -x "$bin/kind" ]]; then
    local work="$cache/src/kind-$KIND_VERSION"
    mkdir -p "$bin"
    log "building sigs.k8s.io/kind $KIND_VERSION"
    tools_module "$work" projector.invalid/controlplane/kind "sigs.k8s.io/kind@$KIND_VERSION" \
      sigs.k8s.io/kind
    (
      cd "$work"
      go build -trimpath -ldflags "-s -w" -o "$bin/kind.tmp" sigs.k8s.io/kind
    ) || fail "go build sigs.k8s.io/kind@$KIND_VERSION"
    mv "$bin/kind.tmp" "$bin/kind"
  fi
  echo "$bin/kind"
}

# Prints why Docker cannot be used (empty output: it can).
docker_problem() {
  local err
  if ! err="$(docker info 2>&1 >/dev/null)"; then
    printf 'no Docker engine (docker info failed: %s)' "$(printf '%s\n' "$err" | tail -n 1)"
  fi
}

exists() { "$1" get clusters 2>/dev/null | grep -qx "$cluster"; }

up() {
  local problem kind
  problem="$(docker_problem)"
  [[ -z "$problem" ]] || fail "$problem"
  kind="$(build | tail -n 1)"
  mkdir -p "$(dirname "$kubeconfig")"
  if exists "$kind"; then
    log "cluster $cluster already exists"
    "$kind" export kubeconfig --name "$cluster" --kubeconfig "$kubeconfig"
  else
    "$kind" create cluster --name "$cluster" --kubeconfig "$kubeconfig" --wait 180s
  fi
  echo "export KUBECONFIG=$kubeconfig"
}

down() {
  local problem kind
  problem="$(docker_problem)"
  if [[ -n "$problem" ]]; then
    log "$problem: no kind cluster can be running"
    return 0
  fi
  kind="$(build | tail -n 1)"
  if exists "$kind"; then
    "$kind" delete cluster --name "$cluster" --kubeconfig "$kubeconfig"
  else
    log "no cluster $cluster"
  fi
  rm -f "$kubeconfig"
}

case "${1:-}" in
  build) build ;;
  up) up ;;
  down) down ;;
  *) echo "usage: $0 build|up|down" >&2; exit 2 ;;
esac
