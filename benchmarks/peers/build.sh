#!/usr/bin/env bash
# Build the benchmark peers (DESIGN.md section 8) from their published Go modules into a cache
# outside the repository, keyed by version: $cache/peers/<name>-<version>/. A second run finds the
# binaries and exits at once. Nothing of a peer's source is kept in this repository: a small
# wrapper module of ours requires the peer's module and `go build`s its main package.
#
#   build.sh [replicator|projection|all]   (default: all)
#
# Progress and errors go to stderr; stdout gets one line per peer built: its directory.
# Exit status: 0 if every requested peer is ready, 1 if any could not be built.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
cache="${PROJECTOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/projector}"
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0

log() { printf '[peers] %s\n' "$*" >&2; }

# Wrapper module in $1 requiring "$2" (module@version) plus "$3" (more module@version lines),
# importing package $4 so `go mod tidy` resolves everything it needs.
wrapper() {
  local work="$1" main_req="$2" pins="$3" pkg="$4" name="$5"
  [[ -f "$work/go.sum" ]] && return 0
  mkdir -p "$work"
  (
    cd "$work"
    rm -f go.mod go.sum
    go mod init "projector.invalid/peers/$name" >/dev/null 2>&1
    go mod edit -go=1.26.0 -require="$main_req"
    local pin
    for pin in $pins; do go mod edit -require="$pin"; done
    printf '//go:build tools\n\npackage tools\n\nimport _ "%s"\n' "$pkg" > tools.go
    go mod tidy >&2
  ) || { rm -f "$work/go.sum"; return 1; }
}

# go mod download, printing the module's directory; the proxy's own words on failure.
download_dir() {
  local out
  out="$(cd / && go mod download -json "$1")" || true
  python3 -c 'import json,sys; d=json.loads(sys.argv[1] or "{}"); print(d.get("Dir") or sys.exit(d.get("Error") or "no Dir"))' "$out"
}

build_replicator() {
  local name=kubernetes-replicator version="$REPLICATOR_VERSION"
  local dir="$cache/peers/$name-$version" work="$cache/src/peers/$name-$version"
  if [[ -x "$dir/$name" ]]; then echo "$dir"; return 0; fi
  local start=$SECONDS src
  log "resolving $REPLICATOR_MODULE@$version"
  src="$(download_dir "$REPLICATOR_MODULE@$version")" \
    || { log "FAILED: go mod download $REPLICATOR_MODULE@$version (error above)"; return 1; }
  # Every pseudo-version pinned must be the commit the module's own glide.lock names.
  local pin mod ver hash locked
  for pin in $REPLICATOR_PINS; do
    mod="${pin%@*}" ver="${pin#*@}"
    [[ "$ver" =~ -([0-9a-f]{12})$ ]] || continue
    hash="${BASH_REMATCH[1]}"
    locked="$(awk -v m="$mod" '$1=="-" && $2=="name:" {cur=$3} $1=="version:" && cur==m {print $2; exit}' \
      "$src/glide.lock")"
    [[ "$locked" == "$hash"* ]] \
      || { log "FAILED: pin $pin does not match glide.lock ($mod: ${locked:-absent})"; return 1; }
  done
  wrapper "$work" "$REPLICATOR_MODULE@$version" "$REPLICATOR_PINS" "$REPLICATOR_MODULE" replicator \
    || { log "FAILED: go mod tidy for $REPLICATOR_MODULE@$version in $work (error above)"; return 1; }
  log "building $name $version (cold: about 3 minutes on 2 cores)"
  mkdir -p "$dir"
  (cd "$work" && go build -trimpath -ldflags "-s -w" -o "$dir/$name.tmp" "$REPLICATOR_MODULE") \
    || { log "FAILED: go build $REPLICATOR_MODULE@$version (error above)"; return 1; }
  mv "$dir/$name.tmp" "$dir/$name"
  log "$name $version ready in $dir ($(( SECONDS - start ))s)"
  echo "$dir"
}

build_projection() {
  local name=projection version="$PROJECTION_VERSION"
  local dir="$cache/peers/$name-$version" work="$cache/src/peers/$name-$version"
  if [[ -x "$dir/$name" ]] && compgen -G "$dir/crds/*.yaml" >/dev/null; then
    echo "$dir"; return 0
  fi
  local start=$SECONDS src
  log "resolving $PROJECTION_MODULE@$version"
  src="$(download_dir "$PROJECTION_MODULE@$version")" \
    || { log "FAILED: go mod download $PROJECTION_MODULE@$version (error above)"; return 1; }
  wrapper "$work" "$PROJECTION_MODULE@$version" "" "$PROJECTION_MODULE/cmd" projection \
    || { log "FAILED: go mod tidy for $PROJECTION_MODULE@$version in $work (error above)"; return 1; }
  log "building $name $version"
  mkdir -p "$dir/crds"
  (cd "$work" && go build -trimpath -ldflags "-s -w" -o "$dir/$name.tmp" "$PROJECTION_MODULE/cmd") \
    || { log "FAILED: go build $PROJECTION_MODULE/cmd@$version (error above)"; return 1; }
  compgen -G "$src/config/crd/bases/*.yaml" >/dev/null \
    || { log "FAILED: no CRDs at config/crd/bases in $PROJECTION_MODULE@$version"; return 1; }
  cp "$src"/config/crd/bases/*.yaml "$dir/crds/"
  chmod u+w "$dir"/crds/*.yaml  # the module cache is read-only
  mv "$dir/$name.tmp" "$dir/$name"
  log "$name $version ready in $dir ($(( SECONDS - start ))s)"
  echo "$dir"
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
