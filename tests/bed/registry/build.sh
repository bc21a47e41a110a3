#!/usr/bin/env bash
# Build the test bed's OCI registry (`make registry-up`, the node tier, `make release` without
# REGISTRY=): main.go beside this file, go-containerregistry's registry package with the
# referrers API on, blobs on disk, plain HTTP on a loopback port. From its Go module into the cache
# outside the repository, keyed by version and main.go, like tests/bed/otel/build.sh; a second run
# finds the binary and prints its path at once.
# shellcheck source=../gobuild.sh
source "$(dirname "${BASH_SOURCE[0]}")/../gobuild.sh" registry
# shellcheck source=versions.env
source "$here/versions.env"
key="$GGCR_VERSION-$(sha256sum "$here/main.go" | cut -c1-12)"
gobuild_bin "registry-$key"

if must_build "$bin/registry" "$cache/src/registry-$key.lock"; then
  work="$cache/src/registry-$key"
  mkdir -p "$work"
  (
    cd "$work"
    rm -f go.mod go.sum
    go mod init projector.invalid/tools/registry >/dev/null 2>&1
    go mod edit -go=1.26.0 -require="github.com/google/go-containerregistry@$GGCR_VERSION"
    cp "$here/main.go" main.go
    log "building the registry (go-containerregistry $GGCR_VERSION)"
    go mod tidy >/dev/null && go build -trimpath -ldflags "-s -w" -o "$bin/registry.tmp" . \
      || fail "go build of the registry in $work"
  ) || exit 1
  mv "$bin/registry.tmp" "$bin/registry"
  log "registry built in $(( $(date +%s) - start ))s"
fi
echo "$bin/registry"
