#!/usr/bin/env bash
# Build containerd (+ containerd-shim-runc-v2, ctr) from its Go module and the pause binary from
# the k8s.io/kubernetes module's build/pause/linux/pause.c into the same cache as the control
# plane's binaries, keyed by version. kubelet comes from tests/bed/controlplane/build.sh (same
# wrapper module as kube-apiserver). A second run finds everything and exits at once.
# shellcheck source=../gobuild.sh
source "$(dirname "${BASH_SOURCE[0]}")/../gobuild.sh" node
gobuild_bin "containerd-$CONTAINERD_VERSION-pause-$KUBE_VERSION"
hold_lock "$cache/node-build.lock"

build_containerd() {
  local work="$cache/src/containerd-$CONTAINERD_VERSION" mod=github.com/containerd/containerd/v2
  local ld="-s -w -X $mod/version.Version=$CONTAINERD_VERSION -X $mod/version.Package=$mod"
  local tags="no_btrfs no_devmapper no_zfs"
  tools_module "$work" projector.invalid/node/containerd "$mod@$CONTAINERD_VERSION" \
    "$mod/cmd/containerd" "$mod/cmd/containerd-shim-runc-v2" "$mod/cmd/ctr"
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
