#!/usr/bin/env bash
# Build a minimal OpenTelemetry Collector (main.go beside this file: the core OTLP receiver, contrib's
# file exporter writing OTLP/JSON, the core debug exporter) from its Go modules into the cache
# outside the repository, keyed by version, like tests/bed/prometheus/build.sh. A second run finds the
# binary and prints its path at once. Every go.opentelemetry.io/collector module must resolve at the
# release pinned in versions.env (v0 modules at OTELCOL_VERSION, v1 at OTELCOL_STABLE_VERSION):
# the build fails otherwise rather than mix releases. `go build` resolves the modules, not `go mod
# tidy`: tidy also wants the test-only dependencies of the file exporter, one of which the module
# proxy does not serve at this release.
# The build holds a lock next to the binary so a `make` and a pytest session never build twice.
# shellcheck source=../gobuild.sh
source "$(dirname "${BASH_SOURCE[0]}")/../gobuild.sh" otelcol
# shellcheck source=versions.env
source "$here/versions.env"
key="$OTELCOL_VERSION-contrib-$OTELCOL_CONTRIB_VERSION-$(sha256sum "$here/main.go" | cut -c1-12)"
gobuild_bin "otelcol-$key"

if must_build "$bin/otelcol" "$cache/src/otelcol-$key.lock"; then
  work="$cache/src/otelcol-$key"
  mkdir -p "$work"
  (
    cd "$work"
    rm -f go.mod go.sum
    go mod init projector.invalid/tools/otelcol >/dev/null 2>&1
    core=go.opentelemetry.io/collector
    contrib=github.com/open-telemetry/opentelemetry-collector-contrib
    go mod edit -go=1.26.0 \
      -require="$core/otelcol@$OTELCOL_VERSION" \
      -require="$core/receiver/otlpreceiver@$OTELCOL_VERSION" \
      -require="$core/exporter/debugexporter@$OTELCOL_VERSION" \
      -require="$core/confmap/provider/fileprovider@$OTELCOL_STABLE_VERSION" \
      -require="$contrib/exporter/fileexporter@$OTELCOL_CONTRIB_VERSION"
    cp "$here/main.go" main.go
    log "building otelcol $OTELCOL_VERSION (file exporter $OTELCOL_CONTRIB_VERSION; cold: several minutes on 2 cores)"
    go build -trimpath -ldflags "-s -w -X main.version=${OTELCOL_VERSION#v}" -o "$bin/otelcol.tmp" . \
      || fail "go build of the collector in $work"
    mixed=$(go list -m -f '{{.Path}} {{.Version}}' all | awk -v v0="$OTELCOL_VERSION" -v v1="$OTELCOL_STABLE_VERSION" \
      '$1 ~ /^go\.opentelemetry\.io\/collector(\/|$)/ && $2 != v0 && $2 != v1')
    [[ -z "$mixed" ]] || fail "collector modules off the pinned release: $mixed"
  ) || exit 1
  mv "$bin/otelcol.tmp" "$bin/otelcol"
  log "otelcol $OTELCOL_VERSION built in $(( $(date +%s) - start ))s"
fi
echo "$bin/otelcol"
