#!/usr/bin/env bash
# Build prometheus and promtool from the Go module github.com/prometheus/prometheus into a cache
# outside the repository, keyed by version (like tests/bed/controlplane/build.sh). A second run finds
# the binaries and exits at once. The web UI's assets are not embedded (no `builtinassets` tag):
# the tests use the HTTP API only. `remove_all_sd` leaves out every service-discovery plugin
# (cloud SDKs, client-go): the tests scrape static targets, and the cold build is several times
# shorter. Debian's `prometheus` package is the documented fallback only.
# The build holds a lock next to the binaries so a `make` and a pytest session never build twice.
# shellcheck source=../gobuild.sh
source "$(dirname "${BASH_SOURCE[0]}")/../gobuild.sh" prometheus
# shellcheck source=versions.env
source "$here/versions.env"
gobuild_bin "prometheus-$PROMETHEUS_MODULE_VERSION"
hold_lock "$cache/prometheus-build.lock"

start=$(date +%s)
if [[ ! -x "$bin/prometheus" || ! -x "$bin/promtool" ]]; then
  work="$cache/src/prometheus-$PROMETHEUS_MODULE_VERSION"
  mod=github.com/prometheus/prometheus
  tools_module "$work" projector.invalid/prometheus "$mod@$PROMETHEUS_MODULE_VERSION" \
    "$mod/cmd/prometheus" "$mod/cmd/promtool"
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
