#!/usr/bin/env bash
# Fetch, check and unpack the pinned test-VM kernels into .cache/kernel/<release>/, using a
# private apt configuration under .cache/apt/<suite>/ so the host's /etc/apt is never touched.
# Also provides the Rust virtiofsd when it can (see below).
#
# Two kernels are pinned (kernel-config/README.md): `main` (pinned-kernel.env: the kernel the
# whole vm tier runs on) and `lts` (pinned-kernel-lts.env: the second kernel, for the core).
#
#   kernel-config/fetch-kernel.sh                        fetch + check + unpack both kernels
#   kernel-config/fetch-kernel.sh [--kernel K] --repin latest   pin the newest build of K's series
#   kernel-config/fetch-kernel.sh [--kernel K] --repin VERSION  pin that Debian version of it
#   kernel-config/fetch-kernel.sh [--kernel K] --print-release  print K's `uname -r`
# K is main (default) or lts; `make kernel [KERNEL=K] [PIN=...]` calls this.
#
# Two Debian package layouts, told apart by the pinned package's name:
#   image:  linux-image-<rel>-unsigned holds boot/{vmlinuz,config,System.map}-<rel> and
#           lib/modules/<rel> (Debian 12's kernels and bookworm-backports' 6.12);
#   binary: linux-binary-<rel> holds usr/lib/modules/<rel>/vmlinuz, linux-base-<rel> its
#           config, System.map and modules.builtin*, linux-modules-<rel> the modules
#           (trixie-backports since 6.19, where linux-image-<rel> is a 2 kB package that only
#           depends on the three). All three .debs are pinned by sha256.
#
# A second run with everything in place does no network access and changes nothing.
set -euo pipefail
# Under pipefail a reader that stops early (grep -q, head, awk's exit) kills the writer with
# SIGPIPE and fails the pipeline at random: every pipeline here reads its input to the end.

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=$ROOT/.cache
DEB_DIR=$CACHE/kernel/debs
MIRROR=http://deb.debian.org/debian
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
# The host's own suite: where virtiofsd would come from (it is installed on the host).
HOST_SUITE=bookworm-backports

say() { echo "kernel: $*"; }
die() { echo "kernel: error: $*" >&2; exit 1; }

pin_file_of() {
  case "$1" in
    main) echo "$ROOT/kernel-config/pinned-kernel.env" ;;
    lts) echo "$ROOT/kernel-config/pinned-kernel-lts.env" ;;
    *) die "unknown kernel '$1' (main or lts)" ;;
  esac
}

release_of() {
  local p=${1#linux-image-}
  p=${p#linux-binary-}
  echo "${p%-unsigned}"
}

# Every apt call goes through these options: own sources list, lists and cache per suite, no
# host preferences, downloads as root (the _apt user cannot write into the work tree).
use_suite() {
  SUITE=$1
  APT_DIR=$CACHE/apt/$SUITE
  APT_OPTS=(
    -o "Dir::Etc::SourceList=$APT_DIR/sources.list"
    -o "Dir::Etc::SourceParts=/dev/null"
    -o "Dir::Etc::Preferences=/dev/null"
    -o "Dir::Etc::PreferencesParts=/dev/null"
    -o "Dir::State::Lists=$APT_DIR/lists"
    -o "Dir::Cache=$APT_DIR/cache"
    -o "APT::Sandbox::User=root"
  )
  APT_UPDATED=""
}

# Load one pin file and derive the rest from it (globals: one kernel at a time).
load_pin() {
  KERNEL_NAME=$1
  PIN_FILE=$(pin_file_of "$1")
  KERNEL_SUITE="" KERNEL_MODULES_PACKAGE="" KERNEL_MODULES_SHA256=""
  KERNEL_BASE_PACKAGE="" KERNEL_BASE_SHA256=""
  [ -r "$PIN_FILE" ] || die "$PIN_FILE is missing; restore it from git"
  # shellcheck source=pinned-kernel.env
  . "$PIN_FILE"
  : "${KERNEL_PACKAGE:?missing in $PIN_FILE}" "${KERNEL_VERSION:?}" "${KERNEL_SHA256:?}"
  case "$KERNEL_PACKAGE" in
    linux-binary-*) LAYOUT=binary ;;
    linux-image-*) LAYOUT=image ;;
    *) die "$PIN_FILE: KERNEL_PACKAGE=$KERNEL_PACKAGE is neither linux-image-* nor linux-binary-*" ;;
  esac
  use_suite "${KERNEL_SUITE:-bookworm-backports}"
  RELEASE=$(release_of "$KERNEL_PACKAGE")          # e.g. 7.3.4+deb13-amd64
  SERIES=$(echo "$RELEASE" | cut -d. -f1,2)        # e.g. 7.3
  FLAVOUR=${RELEASE#*+}                            # e.g. deb13-amd64
  KROOT=$CACHE/kernel/$RELEASE
  STAMP=$KROOT/.damon-hp-extracted
}

# Where an unpacked tree keeps the kernel image, by layout.
vmlinuz_of() {
  if [ "$LAYOUT" = binary ]; then echo "$1/usr/lib/modules/$RELEASE/vmlinuz"
  else echo "$1/boot/vmlinuz-$RELEASE"; fi
}

# The stamp holds every pinned sha256, so a changed pin unpacks again.
stamp_text() {
  echo "$KERNEL_SHA256${KERNEL_MODULES_SHA256:+ $KERNEL_MODULES_SHA256}${KERNEL_BASE_SHA256:+ $KERNEL_BASE_SHA256}"
}

apt_private_update() {
  [ -z "$APT_UPDATED" ] || return 0
  mkdir -p "$APT_DIR/lists/partial" "$APT_DIR/cache/archives/partial"
  local want="deb [signed-by=$KEYRING] $MIRROR $SUITE main"
  if [ "$(cat "$APT_DIR/sources.list" 2>/dev/null)" != "$want" ]; then
    echo "$want" >"$APT_DIR/sources.list"
  fi
  [ -r "$KEYRING" ] || die "$KEYRING is missing; install debian-archive-keyring"
  say "refreshing the private $SUITE package list (.cache/apt/$SUITE)"
  apt-get "${APT_OPTS[@]}" -qq update || die "apt-get update of $SUITE failed (network?)"
  APT_UPDATED=1
}

# The kernel package names of our series, flavour and layout. For the binary layout the
# signed linux-binary-<rel> (what linux-image-<rel> depends on; the same kernel as
# linux-binary-unsigned-<rel> with a Secure Boot signature QEMU ignores).
series_prefix() {
  if [ "$LAYOUT" = binary ]; then echo "linux-binary-$SERIES."; else echo "linux-image-$SERIES."; fi
}
series_pattern() {
  if [ "$LAYOUT" = binary ]; then
    echo "^linux-binary-${SERIES//./\\.}\\.[0-9]+\\+${FLAVOUR}\$"
  else
    echo "^linux-image-${SERIES//./\\.}\\.[0-9]+\\+${FLAVOUR}-unsigned\$"
  fi
}

# Newest "<package> <version>" of our series and flavour in the private lists.
newest_in_series() {
  local pat best_pkg="" best_ver=""
  pat=$(series_pattern)
  for pkg in $(apt-cache "${APT_OPTS[@]}" pkgnames "$(series_prefix)" | grep -E "$pat" | sort); do
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
  apt-cache "${APT_OPTS[@]}" show "$1=$2" 2>/dev/null | awk '/^SHA256:/ && !n++ {print $2}'
}

deb_path() { echo "$DEB_DIR/${1}_${KERNEL_VERSION/:/%3a}_amd64.deb"; }

sha_ok() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]; }

# download_pinned PACKAGE: `apt-get download PACKAGE=$KERNEL_VERSION` into .cache/kernel/debs.
download_pinned() {
  local package=$1 newest
  apt_private_update
  if ! apt-cache "${APT_OPTS[@]}" madison "$package" | grep -F "| $KERNEL_VERSION |" >/dev/null; then
    newest=$(newest_in_series || true)
    echo "kernel: error: the pinned test kernel ($KERNEL_NAME) $package $KERNEL_VERSION has left $SUITE" >&2
    echo "kernel: (backports keeps only the newest builds)." >&2
    if [ -n "$newest" ]; then
      echo "kernel: the newest $SERIES kernel there now is: $newest" >&2
      echo "kernel: to pin it (rewrites kernel-config/$(basename "$PIN_FILE") with its sha256):" >&2
      echo "kernel:     make kernel KERNEL=$KERNEL_NAME PIN=latest" >&2
      echo "kernel: then run the vm tests (make test-vm) and commit kernel-config/$(basename "$PIN_FILE")." >&2
    else
      echo "kernel: $SUITE has no package matching $(series_pattern) any more;" >&2
      echo "kernel: pick another series by hand (see kernel-config/README.md)." >&2
    fi
    exit 1
  fi
  mkdir -p "$DEB_DIR"
  say "downloading $package $KERNEL_VERSION into .cache/kernel/debs"
  (cd "$DEB_DIR" && apt-get "${APT_OPTS[@]}" -qq download "$package=$KERNEL_VERSION") \
    || die "apt-get download $package=$KERNEL_VERSION failed"
}

# checked_deb PACKAGE SHA256: make .cache/kernel/debs hold the pinned .deb, or fail.
checked_deb() {
  local package=$1 sha=$2 deb got
  deb=$(deb_path "$package")
  if ! sha_ok "$deb" "$sha"; then
    rm -f "$deb"
    download_pinned "$package"
  fi
  if ! sha_ok "$deb" "$sha"; then
    got=$(sha256sum "$deb" 2>/dev/null | cut -d' ' -f1 || true)
    rm -f "$deb"
    die "sha256 mismatch for $package $KERNEL_VERSION: got ${got:-no file}, pinned $sha (kernel-config/$(basename "$PIN_FILE")); the file was removed. If Debian rebuilt the package, re-pin with: make kernel KERNEL=$KERNEL_NAME PIN=$KERNEL_VERSION"
  fi
}

# extract DEB...: unpack the kernel's .debs into one tree, .cache/kernel/<release>/.
extract() {
  local deb tmp=$KROOT.tmp.$$
  rm -rf "$tmp"
  mkdir -p "$tmp"
  trap 'rm -rf "$tmp"' EXIT
  for deb in "$@"; do
    say "unpacking $(basename "$deb") into .cache/kernel/$RELEASE"
    dpkg-deb -x "$deb" "$tmp"
  done
  [ -f "$(vmlinuz_of "$tmp")" ] || die "the $LAYOUT-layout package has no $(vmlinuz_of "")"
  if [ ! -e "$tmp/lib" ] && [ -d "$tmp/usr/lib/modules" ]; then
    # Merged-/usr packages keep modules in usr/lib/modules. The host's depmod (kmod 30) and
    # virtme-ng look in <root>/lib/modules, as a merged-/usr system's /lib symlink provides.
    ln -s usr/lib "$tmp/lib"
  fi
  # The .debs leave modules.dep to a postinst; virtme-ng and modprobe need it.
  depmod -a -b "$tmp" "$RELEASE" || die "depmod failed on the unpacked modules"
  stamp_text >"$tmp/.damon-hp-extracted"
  rm -rf "$KROOT"
  mv "$tmp" "$KROOT"
  trap - EXIT
}

ensure_kernel() {
  if [ "$LAYOUT" = binary ]; then
    [ -n "$KERNEL_MODULES_PACKAGE" ] && [ -n "$KERNEL_MODULES_SHA256" ] \
      && [ -n "$KERNEL_BASE_PACKAGE" ] && [ -n "$KERNEL_BASE_SHA256" ] \
      || die "$PIN_FILE pins $KERNEL_PACKAGE without KERNEL_MODULES_* and KERNEL_BASE_*; re-pin: make kernel KERNEL=$KERNEL_NAME PIN=$KERNEL_VERSION"
  fi
  if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$(stamp_text)" ] \
     && [ -f "$(vmlinuz_of "$KROOT")" ]; then
    say "$KERNEL_NAME: $RELEASE ($KERNEL_VERSION) ready in .cache/kernel/$RELEASE"
    return
  fi
  checked_deb "$KERNEL_PACKAGE" "$KERNEL_SHA256"
  local debs=("$(deb_path "$KERNEL_PACKAGE")")
  if [ "$LAYOUT" = binary ]; then
    checked_deb "$KERNEL_BASE_PACKAGE" "$KERNEL_BASE_SHA256"
    checked_deb "$KERNEL_MODULES_PACKAGE" "$KERNEL_MODULES_SHA256"
    debs+=("$(deb_path "$KERNEL_BASE_PACKAGE")" "$(deb_path "$KERNEL_MODULES_PACKAGE")")
  fi
  extract "${debs[@]}"
  say "$KERNEL_NAME: $RELEASE ($KERNEL_VERSION) ready in .cache/kernel/$RELEASE"
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
  use_suite "$HOST_SUITE"
  local gave_up=$CACHE/stamps/virtiofsd-unavailable
  if [ -f "$gave_up" ]; then
    say "virtiofsd unavailable ($(cat "$gave_up")); the test VM uses 9p (rm $gave_up to retry)"
    return
  fi
  mkdir -p "$CACHE/stamps"
  ls "$APT_DIR"/lists/*Packages* >/dev/null 2>&1 || apt_private_update
  if apt-cache "${APT_OPTS[@]}" madison virtiofsd | grep . >/dev/null; then
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
  local want=$1 pkg ver pat
  apt_private_update
  pat=$(series_pattern)
  if [ "$want" = latest ]; then
    read -r pkg ver < <(newest_in_series) || die "no package matching $pat in $SUITE"
  else
    ver=$want
    pkg=$(for p in $(apt-cache "${APT_OPTS[@]}" pkgnames "$(series_prefix)" | grep -E "$pat"); do
            if apt-cache "${APT_OPTS[@]}" madison "$p" | grep -F "| $ver |" >/dev/null; then
              echo "$p"; break; fi; done)
    [ -n "$pkg" ] || die "no package matching $pat with version $ver in $SUITE"
  fi
  local sha mods="" mods_sha="" base="" base_sha=""
  sha=$(index_sha256 "$pkg" "$ver")
  [ -n "$sha" ] || die "the $SUITE index gives no SHA256 for $pkg $ver"
  if [ "$LAYOUT" = binary ]; then
    mods=linux-modules-$(release_of "$pkg")
    mods_sha=$(index_sha256 "$mods" "$ver")
    [ -n "$mods_sha" ] || die "the $SUITE index gives no SHA256 for $mods $ver"
    base=linux-base-$(release_of "$pkg")
    base_sha=$(index_sha256 "$base" "$ver")
    [ -n "$base_sha" ] || die "the $SUITE index gives no SHA256 for $base $ver"
  fi
  {
    echo "# A test-VM kernel ($KERNEL_NAME), pinned. Written by \`make kernel KERNEL=$KERNEL_NAME PIN=latest\`"
    echo "# (kernel-config/fetch-kernel.sh --repin); edit only by that command so the values agree."
    echo "KERNEL_SUITE=$SUITE"
    echo "KERNEL_PACKAGE=$pkg"
    echo "KERNEL_VERSION=$ver"
    echo "KERNEL_SHA256=$sha"
    if [ -n "$mods" ]; then
      echo "KERNEL_MODULES_PACKAGE=$mods"
      echo "KERNEL_MODULES_SHA256=$mods_sha"
      echo "KERNEL_BASE_PACKAGE=$base"
      echo "KERNEL_BASE_SHA256=$base_sha"
    fi
  } >"$PIN_FILE"
  say "pinned $pkg $ver${mods:+, $base and $mods} (sha256 from the signed $SUITE index)"
  load_pin "$KERNEL_NAME"
  APT_UPDATED=1
  ensure_kernel
}

KERNEL_ARG=""
if [ "${1:-}" = --kernel ]; then
  [ -n "${2:-}" ] || die "--kernel needs main or lts"
  KERNEL_ARG=$2
  shift 2
fi
case "${1:-}" in
  "")
    for k in ${KERNEL_ARG:-main lts}; do load_pin "$k"; ensure_kernel; done
    ensure_virtiofsd ;;
  --repin)
    [ -n "${2:-}" ] || die "--repin needs 'latest' or a Debian version"
    load_pin "${KERNEL_ARG:-main}"; repin "$2" ;;
  --print-release) load_pin "${KERNEL_ARG:-main}"; echo "$RELEASE" ;;
  *) die "unknown argument '$1' (see the header of $0)" ;;
esac
