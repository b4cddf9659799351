#!/usr/bin/env bash
# Installs the kernels `cargo xtask vm-test` boots, from Debian's own packages, into a cache
# directory (never into /boot: nothing here touches the host's boot setup).
#
#   scripts/vm-kernels.sh [FLAVOUR...]      default: amd64 cloud-amd64 rt-amd64
#
# FLAVOUR is a Debian kernel flavour. The newest ABI of each flavour is the one bookworm's
# meta-package (linux-image-<flavour>) depends on today; `FLAVOUR@ABI` (e.g. amd64@6.1.0-57) pins
# one, and `6.12:FLAVOUR` takes the 6.12 series bookworm also carries (linux-image-6.12-<flavour>
# meta-package, e.g. 6.12:amd64). Each kernel lands in
#   ${OBSERVER_VM_CACHE:-target/vm}/kernels/<package>/boot/{vmlinuz,config}-<release>
# and the script prints one line per kernel: `<package> <path to vmlinuz>`.
# Idempotent: a kernel already unpacked is not fetched again. Only the vmlinuz and its config are
# kept: the guest boots an initramfs with everything built in that it needs (serial console,
# BPF, BTF, cgroups), so no module is loaded.
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE="${OBSERVER_VM_CACHE:-$PWD/target/vm}"
mkdir -p "$CACHE/kernels" "$CACHE/debs"
log() { printf '\033[1mvm-kernels:\033[0m %s\n' "$*" >&2; }

apt_updated=0
apt_update_once() {
  if [ "$apt_updated" = 0 ]; then
    # A third-party list that cannot be reached must not stop the Debian ones from updating.
    apt-get update -o APT::Update::Error-Mode=any >/dev/null 2>&1 || apt-get update >/dev/null 2>&1 || true
    apt_updated=1
  fi
}

# The ABI (6.1.0-57) the meta-package of a flavour points at: its Depends is
# linux-image-<abi>-<flavour> (the signed image) or linux-image-<abi>-<flavour>-unsigned.
newest_abi() {
  local meta="$1" flavour="$2" dep
  dep="$(apt-cache depends "$meta" 2>/dev/null | sed -n 's/^ *Depends: linux-image-\(.*\)$/\1/p' | head -n1)"
  dep="${dep%-unsigned}"
  dep="${dep%-"$flavour"}"
  [ -n "$dep" ] && printf '%s\n' "$dep"
}

install_one() {
  local spec="$1" flavour abi="" meta series=""
  case "$spec" in
    *:*) series="${spec%%:*}"; spec="${spec#*:}" ;;
  esac
  flavour="${spec%@*}"
  [ "$spec" != "$flavour" ] && abi="${spec#*@}"
  meta="linux-image-${series:+$series-}$flavour"
  if [ -z "$abi" ]; then
    abi="$(newest_abi "$meta" "$flavour" || true)"
    if [ -z "$abi" ]; then
      apt_update_once
      abi="$(newest_abi "$meta" "$flavour" || true)"
    fi
    [ -n "$abi" ] || { log "no Debian package $meta (apt-cache depends $meta found nothing)"; return 1; }
  fi
  # The unsigned image: the same kernel as the signed one, without the Secure Boot wrapper.
  local pkg="linux-image-$abi-$flavour-unsigned"
  local dir="$CACHE/kernels/$pkg"
  local vmlinuz
  vmlinuz="$(ls "$dir"/boot/vmlinuz-* 2>/dev/null | head -n1 || true)"
  if [ -z "$vmlinuz" ]; then
    log "fetching $pkg from Debian"
    apt-cache show "$pkg" >/dev/null 2>&1 || apt_update_once
    rm -rf "$CACHE/debs/$pkg" && mkdir -p "$CACHE/debs/$pkg"
    (cd "$CACHE/debs/$pkg" && apt-get -o APT::Sandbox::User=root download "$pkg" >&2)
    local deb
    deb="$(ls "$CACHE/debs/$pkg"/*.deb)"
    rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
    # Only boot/: the modules are 400 MB unpacked and the guest loads none.
    dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$dir.tmp" --wildcards './boot/vmlinuz-*' './boot/config-*'
    rm -rf "$dir" && mv "$dir.tmp" "$dir"
    rm -rf "$CACHE/debs/$pkg"
    vmlinuz="$(ls "$dir"/boot/vmlinuz-* | head -n1)"
    local config="${vmlinuz/vmlinuz-/config-}"
    for opt in CONFIG_DEBUG_INFO_BTF CONFIG_BPF_SYSCALL CONFIG_MEMCG CONFIG_SERIAL_8250_CONSOLE CONFIG_BLK_DEV_INITRD; do
      grep -q "^$opt=y" "$config" || log "warning: $pkg lacks $opt=y"
    done
  fi
  printf '%s %s\n' "$pkg" "$vmlinuz"
}

if [ "$(id -u)" -ne 0 ]; then
  echo "vm-kernels: must run as root (apt-get update)" >&2
  exit 1
fi
[ $# -gt 0 ] || set -- amd64 cloud-amd64 rt-amd64
for spec in "$@"; do
  install_one "$spec"
done
