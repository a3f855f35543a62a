#!/usr/bin/env bash
# Build the pinned go-ycsb (pin.env) into .cache/go-ycsb/, never into the repository.
#
#   workloads/go-ycsb/build.sh          build it unless already built (prints where it is)
#   workloads/go-ycsb/build.sh --path   print the binary's path (built or not) and exit
#
# `go install module@version` refuses go-ycsb (its go.mod has replace directives), so: download
# the module with `go mod download -json` (the go tool checks it against the Go checksum
# database), check its h1: hash against the pin, copy the read-only module directory to a
# writable one and `go build ./cmd/go-ycsb` there (dependencies checked against its go.sum).
# Every Go directory (GOPATH, GOMODCACHE, GOCACHE) lives under .cache/go, so nothing lands in
# $HOME and a fresh clone builds the same as root in CI. Uses the machine's Go toolchain (go on
# PATH, else /usr/local/go/bin/go); where there is none, installs Debian's golang-go.
# A second run with the binary in place does nothing (the stamp names version and hash).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=pin.env
. "$ROOT/workloads/go-ycsb/pin.env"
: "${GO_YCSB_MODULE:?}" "${GO_YCSB_VERSION:?}" "${GO_YCSB_SUM:?}"

CACHE=$ROOT/.cache
OUT=$CACHE/go-ycsb
BIN=$OUT/go-ycsb-$GO_YCSB_VERSION
STAMP=$OUT/.built-$GO_YCSB_VERSION
GODIR=$CACHE/go

say() { echo "go-ycsb: $*"; }
die() { echo "go-ycsb: error: $*" >&2; exit 1; }

if [ "${1:-}" = "--path" ]; then echo "$BIN"; exit 0; fi
[ $# -eq 0 ] || { echo "usage: $0 [--path]" >&2; exit 2; }

if [ -x "$BIN" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$GO_YCSB_SUM" ]; then
  exit 0
fi

find_go() {
  if command -v go >/dev/null 2>&1; then command -v go; return; fi
  if [ -x /usr/local/go/bin/go ]; then echo /usr/local/go/bin/go; return; fi
  return 1
}
GO=$(find_go) || {
  say "no Go toolchain found; installing Debian's golang-go"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq golang-go \
    || die "could not install golang-go; install a Go toolchain (go on PATH) and run make setup again"
  GO=$(find_go) || die "golang-go is installed but no go command is on PATH"
}

# The project's own Go directories; the checksum database stays on (never GONOSUMDB/GOPRIVATE
# for this module), and the go tool may not fetch another toolchain behind our back.
export GOPATH=$GODIR/path GOMODCACHE=$GODIR/mod GOCACHE=$GODIR/build GOTMPDIR=$GODIR/tmp
export GOFLAGS="-modcacherw -mod=readonly" GOTOOLCHAIN=local GO111MODULE=on
export GONOSUMDB= GONOSUMCHECK= GOPRIVATE= GOINSECURE=
[ "${GOSUMDB:-}" != "off" ] || die "GOSUMDB=off: the module could not be checked against the Go checksum database; unset it"
mkdir -p "$GOPATH" "$GOMODCACHE" "$GOCACHE" "$GOTMPDIR" "$OUT"

t0=$(date +%s)
say "downloading $GO_YCSB_MODULE@$GO_YCSB_VERSION with $("$GO" version)"
# Outside any module, so the download is checked against the checksum database, not a go.sum.
info=$(cd "$GOTMPDIR" && "$GO" mod download -json "$GO_YCSB_MODULE@$GO_YCSB_VERSION") \
  || die "go mod download of $GO_YCSB_MODULE@$GO_YCSB_VERSION failed (network, or the proxy: GOPROXY=$("$GO" env GOPROXY))"
field() { printf '%s\n' "$info" | sed -n "s/^[[:space:]]*\"$1\": \"\(.*\)\",\{0,1\}$/\1/p"; }
sum=$(field Sum)
dir=$(field Dir)
[ "$sum" = "$GO_YCSB_SUM" ] \
  || die "$GO_YCSB_MODULE@$GO_YCSB_VERSION has checksum '$sum', not the pinned $GO_YCSB_SUM (workloads/go-ycsb/pin.env): refusing to build it"
[ -d "$dir" ] || die "go mod download reported no module directory ($dir)"

src=$OUT/src-$GO_YCSB_VERSION
rm -rf "$src"
cp -r "$dir" "$src"
chmod -R u+w "$src"
say "building $BIN (a few minutes the first time)"
tmp=$BIN.tmp.$$
trap 'rm -f "$tmp"' EXIT
log=$OUT/build.log
(cd "$src" && "$GO" build -trimpath -o "$tmp" ./cmd/go-ycsb) >"$log" 2>&1 \
  || { tail -n 20 "$log" >&2; die "go build of go-ycsb failed; the go tool's output: $log"; }
mv -f "$tmp" "$BIN"
rm -rf "$src"
printf '%s\n' "$GO_YCSB_SUM" >"$STAMP"
say "built $BIN in $(( $(date +%s) - t0 )) s"
