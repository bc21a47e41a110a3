#!/usr/bin/env bash
# Build helm from its published Go module (helm.sh/helm/v3) into the cache outside the repository,
# keyed by version, exactly as tests/bed/controlplane/build.sh builds the control plane. A lock keeps
# two concurrent runs (two worktrees, two make jobs) from building into each other; a second run
# finds the binary and prints its path at once.
# shellcheck source=../gobuild.sh
source "$(dirname "${BASH_SOURCE[0]}")/../gobuild.sh" helm
gobuild_bin "helm-$HELM_VERSION"

if must_build "$bin/helm" "$cache/src/helm-$HELM_VERSION.lock"; then
  work="$cache/src/helm-$HELM_VERSION"
  tools_module "$work" projector.invalid/tools/helm "helm.sh/helm/v3@$HELM_VERSION" \
    helm.sh/helm/v3/cmd/helm
  (
    cd "$work"
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
