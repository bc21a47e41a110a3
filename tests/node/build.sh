#!/usr/bin/env bash
# Build containerd (+ containerd-shim-runc-v2, ctr) from its Go module and the pause binary from
# the k8s.io/kubernetes module's build/pause/linux/pause.c into the same cache as the control
# plane's binaries, keyed by version. kubelet comes from tests/controlplane/build.sh (same
# wrapper module as kube-apiserver). A second run finds everything and exits at once.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../controlplane/versions.env
source "$here/../controlplane/versions.env"
cache="${PROJECTOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/projector}"
bin="$cache/bin/containerd-$CONTAINERD_VERSION-pause-$KUBE_VERSION"
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
mkdir -p "$bin"
exec 9>"$cache/node-build.lock"
flock 9

log() { printf '[node] %s\n' "$*" >&2; }
fail() { log "FAILED: $*"; exit 1; }

build_containerd() {
  local work="$cache/src/containerd-$CONTAINERD_VERSION" mod=github.com/containerd/containerd/v2
  local ld="-s -w -X $mod/version.Version=$CONTAINERD_VERSION -X $mod/version.Package=$mod"
  local tags="no_btrfs no_devmapper no_zfs"
  mkdir -p "$work"
  if [[ ! -f "$work/go.sum" ]]; then
    log "resolving $mod@$CONTAINERD_VERSION"
    (
      cd "$work"
      rm -f go.mod
      go mod init projector.invalid/node/containerd >/dev/null 2>&1
      go mod edit -go=1.26.0 -require="$mod@$CONTAINERD_VERSION"
      printf '//go:build tools\n\npackage tools\n\nimport (\n\t_ "%s/cmd/containerd"\n\t_ "%s/cmd/containerd-shim-runc-v2"\n\t_ "%s/cmd/ctr"\n)\n' \
        "$mod" "$mod" "$mod" > tools.go
      go mod tidy >/dev/null || fail "go mod tidy in $work"
    )
  fi
  for cmd in containerd containerd-shim-runc-v2 ctr; do
    [[ -x "$bin/$cmd" ]] && continue
    log "building $cmd $CONTAINERD_VERSION"
    local t0; t0=$(date +%s)
    (cd "$work" && go build -trimpath -tags "$tags" -ldflags "$ld" -o "$bin/$cmd.tmp" "$mod/cmd/$cmd") \
      || fail "go build $mod/cmd/$cmd@$CONTAINERD_VERSION"
    mv "$bin/$cmd.tmp" "$bin/$cmd"
    log "built $cmd in $(( $(date +%s) - t0 ))s"
  done
}

build_pause() {
  [[ -x "$bin/pause" ]] && return
  local dir
  dir="$(cd "$(mktemp -d)" && go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')" \
    || fail "go mod download k8s.io/kubernetes@$KUBE_VERSION"
  log "building pause from $dir/build/pause/linux/pause.c"
  gcc -Os -static -DVERSION="$KUBE_VERSION" -o "$bin/pause.tmp" "$dir/build/pause/linux/pause.c" \
    || fail "gcc pause.c (needs gcc and libc6-dev: make node-packages)"
  strip "$bin/pause.tmp"
  mv "$bin/pause.tmp" "$bin/pause"
}

start=$(date +%s)
build_pause
build_containerd
log "node binaries ready in $bin ($(( $(date +%s) - start ))s)"
echo "$bin"
