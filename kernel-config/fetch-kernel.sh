#!/usr/bin/env bash
# Fetch, check and unpack the pinned test-VM kernel (kernel-config/pinned-kernel.env) into
# .cache/kernel/<release>/, using a private apt configuration under .cache/apt so the host's
# /etc/apt is never touched. Also provides the Rust virtiofsd when it can (see below).
#
#   kernel-config/fetch-kernel.sh                 fetch + check + unpack the pinned kernel
#   kernel-config/fetch-kernel.sh --repin latest  pin the newest kernel of the same series
#   kernel-config/fetch-kernel.sh --repin VERSION pin that Debian version of the same series
#   kernel-config/fetch-kernel.sh --print-release print the pinned kernel's `uname -r`
#
# A second run with everything in place does no network access and changes nothing.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PIN_FILE=$ROOT/kernel-config/pinned-kernel.env
CACHE=$ROOT/.cache
APT_DIR=$CACHE/apt
DEB_DIR=$CACHE/kernel/debs
SUITE=bookworm-backports
MIRROR=http://deb.debian.org/debian
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg

say() { echo "kernel: $*"; }
die() { echo "kernel: error: $*" >&2; exit 1; }

# shellcheck source=pinned-kernel.env
. "$PIN_FILE"
: "${KERNEL_PACKAGE:?missing in $PIN_FILE}" "${KERNEL_VERSION:?}" "${KERNEL_SHA256:?}"

release_of() { local p=${1#linux-image-}; echo "${p%-unsigned}"; }
RELEASE=$(release_of "$KERNEL_PACKAGE")          # e.g. 6.12.95+deb12-amd64
SERIES=$(echo "$RELEASE" | cut -d. -f1,2)        # e.g. 6.12
FLAVOUR=${RELEASE#*+}                            # e.g. deb12-amd64
KROOT=$CACHE/kernel/$RELEASE
STAMP=$KROOT/.damon-hp-extracted

# Every apt call goes through these options: own sources list, lists and cache, no host
# preferences, downloads as root (the _apt user cannot write into the work tree).
APT_OPTS=(
  -o "Dir::Etc::SourceList=$APT_DIR/sources.list"
  -o "Dir::Etc::SourceParts=/dev/null"
  -o "Dir::Etc::Preferences=/dev/null"
  -o "Dir::Etc::PreferencesParts=/dev/null"
  -o "Dir::State::Lists=$APT_DIR/lists"
  -o "Dir::Cache=$APT_DIR/cache"
  -o "APT::Sandbox::User=root"
)

apt_private_update() {
  mkdir -p "$APT_DIR/lists/partial" "$APT_DIR/cache/archives/partial"
  local want="deb [signed-by=$KEYRING] $MIRROR $SUITE main"
  if [ "$(cat "$APT_DIR/sources.list" 2>/dev/null)" != "$want" ]; then
    echo "$want" >"$APT_DIR/sources.list"
  fi
  [ -r "$KEYRING" ] || die "$KEYRING is missing; install debian-archive-keyring"
  say "refreshing the private $SUITE package list (.cache/apt)"
  apt-get "${APT_OPTS[@]}" -qq update || die "apt-get update of $SUITE failed (network?)"
}

# Newest "<package> <version>" of our series and flavour in the private lists.
newest_in_series() {
  local pat="^linux-image-${SERIES//./\\.}\\.[0-9]+\\+${FLAVOUR}-unsigned\$"
  local best_pkg="" best_ver=""
  for pkg in $(apt-cache "${APT_OPTS[@]}" pkgnames linux-image- | grep -E "$pat" | sort); do
    for ver in $(apt-cache "${APT_OPTS[@]}" madison "$pkg" | awk -F'|' '{gsub(/ /,"",$2); print $2}'); do
      if [ -z "$best_ver" ] || dpkg --compare-versions "$ver" gt "$best_ver"; then
        best_pkg=$pkg best_ver=$ver
      fi
    done
  done
  [ -n "$best_pkg" ] && echo "$best_pkg $best_ver"
}

# SHA256 of a package version from the signed index (apt verified it against InRelease).
index_sha256() {
  apt-cache "${APT_OPTS[@]}" show "$1=$2" 2>/dev/null | awk '/^SHA256:/{print $2; exit}'
}

deb_path() { echo "$DEB_DIR/${KERNEL_PACKAGE}_${KERNEL_VERSION/:/%3a}_amd64.deb"; }

sha_ok() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$KERNEL_SHA256" ]; }

download_pinned() {
  apt_private_update
  if ! apt-cache "${APT_OPTS[@]}" madison "$KERNEL_PACKAGE" | grep -qF "| $KERNEL_VERSION |"; then
    local newest
    newest=$(newest_in_series || true)
    echo "kernel: error: the pinned test kernel $KERNEL_PACKAGE $KERNEL_VERSION has left $SUITE" >&2
    echo "kernel: (backports keeps only the newest build)." >&2
    if [ -n "$newest" ]; then
      echo "kernel: the newest $SERIES kernel there now is: $newest" >&2
      echo "kernel: to pin it (rewrites kernel-config/pinned-kernel.env with its sha256):" >&2
      echo "kernel:     make kernel PIN=latest" >&2
      echo "kernel: then run the vm tests (make test-vm) and commit kernel-config/pinned-kernel.env." >&2
    else
      echo "kernel: $SUITE has no linux-image-$SERIES.*+$FLAVOUR-unsigned any more;" >&2
      echo "kernel: pick another series by hand (see kernel-config/README.md)." >&2
    fi
    exit 1
  fi
  mkdir -p "$DEB_DIR"
  say "downloading $KERNEL_PACKAGE $KERNEL_VERSION (~100 MB) into .cache/kernel/debs"
  (cd "$DEB_DIR" && apt-get "${APT_OPTS[@]}" -qq download "$KERNEL_PACKAGE=$KERNEL_VERSION") \
    || die "apt-get download $KERNEL_PACKAGE=$KERNEL_VERSION failed"
}

extract() {
  local deb=$1 tmp=$KROOT.tmp.$$
  say "unpacking $(basename "$deb") into .cache/kernel/$RELEASE"
  rm -rf "$tmp"
  mkdir -p "$tmp"
  trap 'rm -rf "$tmp"' EXIT
  dpkg-deb -x "$deb" "$tmp"
  [ -f "$tmp/boot/vmlinuz-$RELEASE" ] || die "$deb has no boot/vmlinuz-$RELEASE"
  # The .deb leaves modules.dep to its postinst; virtme-ng and modprobe need it.
  depmod -a -b "$tmp" "$RELEASE" || die "depmod failed on the unpacked modules"
  echo "$KERNEL_SHA256" >"$tmp/.damon-hp-extracted"
  rm -rf "$KROOT"
  mv "$tmp" "$KROOT"
  trap - EXIT
}

ensure_kernel() {
  if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$KERNEL_SHA256" ] \
     && [ -f "$KROOT/boot/vmlinuz-$RELEASE" ]; then
    say "$RELEASE ($KERNEL_VERSION) ready in .cache/kernel/$RELEASE"
    return
  fi
  local deb
  deb=$(deb_path)
  if ! sha_ok "$deb"; then
    rm -f "$deb"
    download_pinned
  fi
  if ! sha_ok "$deb"; then
    local got
    got=$(sha256sum "$deb" 2>/dev/null | cut -d' ' -f1 || true)
    rm -f "$deb"
    die "sha256 mismatch for $KERNEL_PACKAGE $KERNEL_VERSION: got ${got:-no file}, pinned $KERNEL_SHA256 (kernel-config/pinned-kernel.env); the file was removed. If Debian rebuilt the package, re-pin with: make kernel PIN=$KERNEL_VERSION"
  fi
  extract "$deb"
  say "$RELEASE ($KERNEL_VERSION) ready in .cache/kernel/$RELEASE"
}

# virtiofsd lets virtme-ng share the host filesystem over virtio-fs; without it the VM uses
# 9p, where every file access is a slow round trip under TCG (`python -c pass` takes ~6.6 s
# in the guest over 9p, ~1 s over virtio-fs). Debian 12 has no Rust virtiofsd (not in main,
# not in bookworm-backports as of 2026-11), so: backports if it ever appears there, else a
# pinned build from crates.io when a Rust toolchain is present, else 9p.
VIRTIOFSD_CRATE_VERSION=1.14.0
VIRTIOFSD_ROOT=/usr/local

have_rust_virtiofsd() {
  # qemu 7.2's own C virtiofsd (/usr/lib/qemu/virtiofsd) does not count: virtme-ng cannot
  # drive it and falls back to 9p after a 3 s wait. Only the Rust daemon (1.x) does.
  local p
  for p in virtiofsd /usr/libexec/virtiofsd /usr/lib/virtiofsd /usr/lib/qemu/virtiofsd; do
    if "$p" --version 2>/dev/null | grep -q '^virtiofsd 1\.'; then return 0; fi
  done
  return 1
}

ensure_virtiofsd() {
  have_rust_virtiofsd && return
  local gave_up=$CACHE/stamps/virtiofsd-unavailable
  if [ -f "$gave_up" ]; then
    say "virtiofsd unavailable ($(cat "$gave_up")); the test VM uses 9p (rm $gave_up to retry)"
    return
  fi
  mkdir -p "$CACHE/stamps"
  ls "$APT_DIR"/lists/*Packages* >/dev/null 2>&1 || apt_private_update
  if apt-cache "${APT_OPTS[@]}" madison virtiofsd | grep -q .; then
    mkdir -p "$CACHE/virtiofsd"
    (cd "$CACHE/virtiofsd" && apt-get "${APT_OPTS[@]}" -qq download virtiofsd)
    say "installing virtiofsd from $SUITE"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$CACHE"/virtiofsd/virtiofsd_*.deb
    return
  fi
  local cargo
  cargo=$(command -v cargo || ls "${HOME:-/root}/.cargo/bin/cargo" 2>/dev/null || true)
  if [ -z "$cargo" ]; then
    echo "not in $SUITE, no cargo to build it" >"$gave_up"
    say "virtiofsd is not in $SUITE and no Rust toolchain is here; the test VM uses 9p"
    return
  fi
  say "building virtiofsd $VIRTIOFSD_CRATE_VERSION from crates.io into $VIRTIOFSD_ROOT/bin" \
      "(once per machine, ~3 min)"
  if "$cargo" install --quiet --locked --root "$VIRTIOFSD_ROOT" \
       "virtiofsd@$VIRTIOFSD_CRATE_VERSION" >"$CACHE/virtiofsd-build.log" 2>&1 \
     && have_rust_virtiofsd; then
    say "virtiofsd $VIRTIOFSD_CRATE_VERSION installed"
  else
    echo "cargo build failed, see .cache/virtiofsd-build.log" >"$gave_up"
    say "virtiofsd build failed (.cache/virtiofsd-build.log); the test VM uses 9p instead"
  fi
}

repin() {
  local want=$1 pkg ver
  apt_private_update
  if [ "$want" = latest ]; then
    read -r pkg ver < <(newest_in_series) || die "no linux-image-$SERIES.*+$FLAVOUR-unsigned in $SUITE"
  else
    ver=$want
    pkg=$(for p in $(apt-cache "${APT_OPTS[@]}" pkgnames linux-image-$SERIES. | grep -E "\\+${FLAVOUR}-unsigned\$"); do
            apt-cache "${APT_OPTS[@]}" madison "$p" | grep -qF "| $ver |" && echo "$p"; done | head -1)
    [ -n "$pkg" ] || die "no linux-image-$SERIES.*+$FLAVOUR-unsigned with version $ver in $SUITE"
  fi
  local sha
  sha=$(index_sha256 "$pkg" "$ver")
  [ -n "$sha" ] || die "the $SUITE index gives no SHA256 for $pkg $ver"
  cat >"$PIN_FILE" <<EOF
# The test-VM kernel, pinned. Written by \`make kernel PIN=latest\` (kernel-config/fetch-kernel.sh --repin);
# edit only by that command so the three values always agree.
KERNEL_PACKAGE=$pkg
KERNEL_VERSION=$ver
KERNEL_SHA256=$sha
EOF
  say "pinned $pkg $ver (sha256 $sha from the signed $SUITE index)"
  KERNEL_PACKAGE=$pkg KERNEL_VERSION=$ver KERNEL_SHA256=$sha
  RELEASE=$(release_of "$pkg") KROOT=$CACHE/kernel/$(release_of "$pkg")
  STAMP=$KROOT/.damon-hp-extracted
  ensure_kernel
}

case "${1:-}" in
  "") ensure_kernel; ensure_virtiofsd ;;
  --repin) [ -n "${2:-}" ] || die "--repin needs 'latest' or a Debian version"; repin "$2" ;;
  --print-release) echo "$RELEASE" ;;
  *) die "unknown argument '$1' (see the header of $0)" ;;
esac
