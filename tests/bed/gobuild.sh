# shellcheck shell=bash
# Sourced by the Go build scripts (tests/bed/*/build.sh, tests/bed/kind/kind.sh): the cache
# outside the repository they build into, the Go settings, their log lines, the lock that keeps
# two builds (two worktrees, a make and a pytest session) from writing the same files, and the
# wrapper module a tool is built from (a module of ours that requires the tool's module and
# imports its commands from a generated tools.go, so `go mod tidy` pins everything they need).
#
#   source "$(dirname "${BASH_SOURCE[0]}")/../gobuild.sh" NAME   # sets here, cache; set -euo
#   gobuild_bin "NAME-$VERSION"                                   # sets bin, made
#   hold_lock "$cache/NAME.lock"
#   if must_build "$bin/NAME" "$cache/src/NAME-$VERSION.lock"; then ... fi  # sets start
#   tools_module "$work" projector.invalid/... "module@version" import/path ...

set -euo pipefail
_gobuild_name="$1"
here="$(cd "$(dirname "${BASH_SOURCE[1]}")" && pwd)"
# shellcheck source=controlplane/versions.env
source "$(dirname "${BASH_SOURCE[0]}")/controlplane/versions.env"
cache="${PROJECTOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/projector}"
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
mkdir -p "$cache/src"

gobuild_bin() {
  bin="$cache/bin/$1"
  mkdir -p "$bin"
}

log() { printf '[%s] %s\n' "$_gobuild_name" "$*" >&2; }
fail() { log "FAILED: $*"; exit 1; }

hold_lock() {
  exec 9>"$1"
  flock 9
}

# True if binary $1 is still to be built, checked again under lock $2 (held from then on): a
# second run waits for the first and then finds the binary; one that finds it at once takes no
# lock. Sets start, for the "built in" log line.
must_build() {
  [[ -x "$1" ]] && return 1
  hold_lock "$2"
  start=$(date +%s)
  [[ ! -x "$1" ]]
}

tools_module() {
  local work="$1" name="$2" require="$3"
  shift 3
  mkdir -p "$work"
  [[ -f "$work/go.sum" ]] && return 0
  (
    cd "$work"
    rm -f go.mod
    go mod init "$name" >/dev/null 2>&1
    go mod edit -go=1.26.0 -require="$require"
    { printf '//go:build tools\n\npackage tools\n\nimport (\n'; printf '\t_ "%s"\n' "$@"; printf ')\n'; } > tools.go
    go mod tidy >/dev/null || fail "go mod tidy in $work"
  )
}
