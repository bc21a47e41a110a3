#!/usr/bin/env bash
# Build etcd and, from the one k8s.io/kubernetes wrapper module, kube-apiserver,
# kube-controller-manager, kube-scheduler, kubelet and kubectl into a cache outside the repository,
# keyed by version. A second run finds the binaries and exits at once.
#
# Why wrapper modules: k8s.io/kubernetes requires its staging modules at v0.0.0 and maps them to
# ./staging by `replace`, which only the main module may do; so a small module of ours requires
# k8s.io/kubernetes and re-declares those replaces, generated from the published go.mod (never typed).
# shellcheck source=../gobuild.sh
source "$(dirname "${BASH_SOURCE[0]}")/../gobuild.sh" controlplane
# make compat builds other Kubernetes minors beside the pinned one: PROJECTOR_KUBE_VERSION picks the
# k8s.io/kubernetes module version (cache, lock and binaries are keyed by it).
KUBE_VERSION="${PROJECTOR_KUBE_VERSION:-$KUBE_VERSION}"
gobuild_bin "kube-$KUBE_VERSION-etcd-$ETCD_VERSION"
# Two builds at once (make binaries and a pytest session) would write the same .tmp files; builds
# of different versions write different files, so one need not wait for the other.
hold_lock "$cache/kube-build-$KUBE_VERSION.lock"
# The commands of the wrapper module (tools.go is generated from this list).
# PROJECTOR_KUBE_CMDS narrows it (make compat needs no kubelet: it starts no node).
read -r -a KUBE_CMDS <<< "${PROJECTOR_KUBE_CMDS:-kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl}"

build_kube() {
  local work="$cache/src/kube-$KUBE_VERSION" minor="${KUBE_VERSION#v1.}"
  local staging="v0.${minor}"
  mkdir -p "$work"
  if [[ ! -f "$work/go.sum" ]]; then
    log "resolving k8s.io/kubernetes@$KUBE_VERSION"
    local gomod
    gomod="$(cd "$(mktemp -d)" && go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" \
      | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')" \
      || fail "go mod download k8s.io/kubernetes@$KUBE_VERSION"
    (
      cd "$work"
      rm -f go.mod go.sum
      go mod init projector.invalid/controlplane/kube >/dev/null 2>&1
      go mod edit -go=1.26.0 -require="k8s.io/kubernetes@$KUBE_VERSION"
      sed -n 's|^[[:space:]]*\(k8s.io/[^ ]*\) => ./staging/src/k8s.io/.*|\1|p' "$gomod" \
        | while read -r m; do go mod edit -replace="$m=$m@$staging"; done
    )
  fi
  # A cache made by an older build.sh holds a tools.go (and go.sum) for fewer commands: rewrite
  # it and tidy again whenever it is not exactly ours, so a warm cache grows instead of failing.
  local tools
  tools="$(printf '//go:build tools\n\npackage tools\n\nimport (\n'; \
    for cmd in "${KUBE_CMDS[@]}"; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$cmd"; done; printf ')\n')"
  if [[ "$(cat "$work/tools.go" 2>/dev/null)" != "$tools" ]]; then
    log "tidying $work for ${KUBE_CMDS[*]}"
    printf '%s\n' "$tools" > "$work/tools.go"
    (cd "$work" && go mod tidy >/dev/null) || fail "go mod tidy in $work"
  fi
  local ld="-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION"
  ld+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${minor%%.*}"
  ld+=" -X k8s.io/component-base/version.gitTreeState=clean"
  for cmd in "${KUBE_CMDS[@]}"; do
    [[ -x "$bin/$cmd" ]] && continue
    log "building $cmd $KUBE_VERSION (cold: many minutes on 2 cores)"
    local t0; t0=$(date +%s)
    (cd "$work" && go build -trimpath -ldflags "$ld" -o "$bin/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd") \
      || fail "go build k8s.io/kubernetes/cmd/$cmd@$KUBE_VERSION"
    mv "$bin/$cmd.tmp" "$bin/$cmd"
    log "built $cmd in $(( $(date +%s) - t0 ))s"
  done
}

build_etcd() {
  [[ -x "$bin/etcd" ]] && return
  local work="$cache/src/etcd-$ETCD_VERSION"
  log "building etcd $ETCD_VERSION"
  tools_module "$work" projector.invalid/controlplane/etcd "go.etcd.io/etcd/server/v3@$ETCD_VERSION" \
    go.etcd.io/etcd/server/v3
  (
    cd "$work"
    go build -trimpath -ldflags "-s -w" -o "$bin/etcd.tmp" go.etcd.io/etcd/server/v3
  ) || fail "go build go.etcd.io/etcd/server/v3@$ETCD_VERSION"
  mv "$bin/etcd.tmp" "$bin/etcd"
}

start=$(date +%s)
build_etcd
build_kube
log "binaries ready in $bin ($(( $(date +%s) - start ))s)"
echo "$bin"
