#!/usr/bin/env bash
# Build prometheus and promtool from the Go module github.com/prometheus/prometheus into a cache
# outside the repository, keyed by version (like tests/controlplane/build.sh). A second run finds
# the binaries and exits at once. The web UI's assets are not embedded (no `builtinassets` tag):
# the tests use the HTTP API only. `remove_all_sd` leaves out every service-discovery plugin
# (cloud SDKs, client-go): the tests scrape static targets, and the cold build is several times
# shorter. Debian's `prometheus` package is the documented fallback only.
# The build holds a lock next to the binaries so a `make` and a pytest session never build twice.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
cache="${PROJECTOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/projector}"
bin="$cache/bin/prometheus-$PROMETHEUS_MODULE_VERSION"
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
mkdir -p "$bin"

log() { printf '[prometheus] %s\n' "$*" >&2; }
fail() { log "FAILED: $*"; exit 1; }

exec 9>"$cache/prometheus-build.lock"
flock 9

start=$(date +%s)
if [[ ! -x "$bin/prometheus" || ! -x "$bin/promtool" ]]; then
  work="$cache/src/prometheus-$PROMETHEUS_MODULE_VERSION"
  mkdir -p "$work"
  (
    cd "$work"
    if [[ ! -f go.sum ]]; then
      log "resolving github.com/prometheus/prometheus@$PROMETHEUS_MODULE_VERSION"
      rm -f go.mod
      go mod init projector.invalid/prometheus >/dev/null 2>&1
      go mod edit -go=1.26.0 -require="github.com/prometheus/prometheus@$PROMETHEUS_MODULE_VERSION"
      cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
GO
      go mod tidy >/dev/null || fail "go mod tidy in $work"
    fi
  )
  ld="-s -w -X github.com/prometheus/common/version.Version=${PROMETHEUS_MODULE_VERSION#v}"
  for cmd in prometheus promtool; do
    [[ -x "$bin/$cmd" ]] && continue
    log "building $cmd $PROMETHEUS_MODULE_VERSION (cold: several minutes on 2 cores)"
    (cd "$work" && go build -trimpath -tags remove_all_sd -ldflags "$ld" -o "$bin/$cmd.tmp" \
      "github.com/prometheus/prometheus/cmd/$cmd") \
      || fail "go build github.com/prometheus/prometheus/cmd/$cmd@$PROMETHEUS_MODULE_VERSION"
    mv "$bin/$cmd.tmp" "$bin/$cmd"
  done
fi
log "binaries ready in $bin ($(( $(date +%s) - start ))s)"
echo "$bin"
