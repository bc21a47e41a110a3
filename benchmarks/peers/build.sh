#!/usr/bin/env bash
# Build the benchmark peers (DESIGN.md section 8) into a cache outside the repository, keyed by
# version: $cache/peers/<name>-<version>/. A second run finds the binaries and exits at once.
#
# Source: the archives of their public repositories in $PROJECTOR_PEERS_SRC (default: the
# `shared/peers` folder next to this repository's directory, see its README), unpacked into
# $cache/src/peers/; their Go dependencies come from the module proxy (about 4 minutes each on 2
# cores, cold module cache). Where the folder or an archive is absent: `go install` of the pinned
# version. Nothing of a peer's source is kept in this repository.
#
#   build.sh [replicator|projection|all]   (default: all)
#
# Progress and errors go to stderr; stdout gets one line per peer built: its directory.
# Exit status: 0 if every requested peer is ready, 1 if any could not be built.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
cache="${PROJECTOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/projector}"
peers_src="${PROJECTOR_PEERS_SRC:-$(dirname "$repo")/shared/peers}"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-buildvcs=false

log() { printf '[peers] %s\n' "$*" >&2; }

# build NAME VERSION ARCHIVE MODULE PKG(relative, e.g. . or ./cmd) QUERY(for go install)
#   -> binary at $dir/NAME
build() {
  local name="$1" version="$2" archive="$3" module="$4" pkg="$5" query="$6"
  local dir="$cache/peers/$name-$version" src="$cache/src/peers/$name-$version"
  local start=$SECONDS
  mkdir -p "$dir"
  if [[ -f "$peers_src/$archive" ]]; then
    log "building $name $version from $peers_src/$archive (cold: about 4 minutes on 2 cores)"
    rm -rf "$src" && mkdir -p "$src"
    tar -xzf "$peers_src/$archive" -C "$src" \
      || { log "FAILED: cannot unpack $peers_src/$archive"; return 1; }
    local top
    top="$(find "$src" -mindepth 1 -maxdepth 1 -type d | head -1)"
    (cd "$top" && go build -trimpath -ldflags "-s -w" -o "$dir/$name.tmp" "$pkg") \
      || { log "FAILED: go build $pkg in $top (error above)"; return 1; }
    if [[ "$name" == projection ]]; then
      mkdir -p "$dir/crds" && cp "$top"/config/crd/bases/*.yaml "$dir/crds/" \
        || { log "FAILED: no CRDs at config/crd/bases in $archive"; return 1; }
    fi
  else
    local gobin="$cache/src/peers/$name-$version-bin" target="$module"
    [[ "$pkg" != . ]] && target="$module/${pkg#./}"
    log "no $peers_src/$archive: go install $target@$query"
    mkdir -p "$gobin"
    GOBIN="$gobin" go install -trimpath -ldflags "-s -w" "$target@$query" \
      || { log "FAILED: go install $target@$query (error above)"; return 1; }
    mv "$gobin/$(basename "$target")" "$dir/$name.tmp"
    if [[ "$name" == projection ]]; then
      local msrc
      msrc="$(cd / && go list -m -json "$module@$query" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("Dir",""))')"
      mkdir -p "$dir/crds" && cp "$msrc"/config/crd/bases/*.yaml "$dir/crds/" && chmod u+w "$dir"/crds/*.yaml \
        || { log "FAILED: no CRDs at config/crd/bases in $module@$version"; return 1; }
    fi
  fi
  mv "$dir/$name.tmp" "$dir/$name"
  log "$name $version ready in $dir ($(( SECONDS - start ))s)"
  echo "$dir"
}

build_replicator() {
  local dir="$cache/peers/kubernetes-replicator-$REPLICATOR_VERSION"
  if [[ -x "$dir/kubernetes-replicator" ]]; then echo "$dir"; return 0; fi
  build kubernetes-replicator "$REPLICATOR_VERSION" "$REPLICATOR_ARCHIVE" "$REPLICATOR_MODULE" . \
    "$REPLICATOR_VERSION"
}

build_projection() {
  local dir="$cache/peers/projection-$PROJECTION_VERSION"
  if [[ -x "$dir/projection" ]] && compgen -G "$dir/crds/*.yaml" >/dev/null; then
    echo "$dir"; return 0
  fi
  build projection "$PROJECTION_VERSION" "$PROJECTION_ARCHIVE" "$PROJECTION_MODULE" ./cmd \
    "$PROJECTION_COMMIT"
}

status=0
case "${1:-all}" in
  replicator) build_replicator || status=1 ;;
  projection) build_projection || status=1 ;;
  all)
    build_replicator || status=1
    build_projection || status=1
    ;;
  *) log "usage: $0 [replicator|projection|all]"; exit 2 ;;
esac
exit "$status"
