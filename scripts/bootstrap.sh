#!/usr/bin/env bash
# Installs everything observer's build and tests need on a Debian bookworm machine, as root.
# Idempotent: each step checks first, so a second run finishes in seconds.
set -euo pipefail

log() { printf '\033[1mbootstrap:\033[0m %s\n' "$*"; }

if [ "$(id -u)" -ne 0 ]; then
  echo "bootstrap: must run as root (installs Debian packages)" >&2
  exit 1
fi

export PATH="$HOME/.cargo/bin:$PATH"

# Debian packages: LLVM 22 for bpf-linker, protoc for the CRI client, containerd/runc/busybox for
# the runtime tests, bpftool for inspecting programs, procps/iproute2 for the tests' helpers,
# qemu-system-x86 for the VM tests (cargo xtask vm-test; busybox-static is their guest's shell too)
# and cpio, which checks the initramfs writer; prometheus, the real scraper the Grafana dashboard's
# queries are tested against (tests/tests/dashboard.rs). The kernels those VMs boot are Debian
# packages too, installed by scripts/vm-kernels.sh into target/vm when a VM test needs them.
# mmdebstrap and socat: the test cluster's guest node (cargo xtask cluster up --nodes 2), whose
# disk image mmdebstrap builds from Debian's packages and whose connections to the API server
# qemu relays through socat. tcpdump: the plugin test's capture on the agent's port (no user's
# credential may cross it).
PKGS=(llvm-22-dev libpolly-22-dev libzstd-dev zlib1g-dev protobuf-compiler containerd runc busybox-static
      bpftool pkg-config qemu-system-x86 cpio prometheus mmdebstrap socat tcpdump)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  # A third-party list that cannot be reached must not stop the Debian ones from updating.
  apt-get update -o APT::Update::Error-Mode=any >/dev/null 2>&1 || apt-get update >/dev/null 2>&1 || true
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
else
  log "Debian packages present"
fi

# The kernel side is built by a pinned nightly with build-std (rust-src); its LLVM (22) is the one
# bpf-linker is built against below. observer-user/build.rs, xtask and .ci/run name the same pin.
NIGHTLY=nightly-2026-05-19
if ! rustup component list --toolchain "$NIGHTLY" --installed 2>/dev/null | grep -q '^rust-src'; then
  log "installing the $NIGHTLY toolchain (rust-src, clippy)"
  rustup toolchain install "$NIGHTLY" --profile minimal --component rust-src --component clippy
else
  log "$NIGHTLY with rust-src present"
fi

# bpf-linker links the eBPF object; it must use the same LLVM major as the nightly (22).
if ! bpf-linker --version 2>/dev/null | grep -q '^bpf-linker 0\.13'; then
  log "building bpf-linker 0.13 against LLVM 22 (takes a few minutes)"
  PATH=/usr/lib/llvm-22/bin:$PATH cargo install --locked bpf-linker --version '~0.13' \
    --no-default-features --features llvm-22
else
  log "bpf-linker present"
fi

# tracefs is where tracepoints are listed; the agent mounts it itself too, this is for the tests' helpers.
if [ ! -e /sys/kernel/tracing/events ]; then
  mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
fi

log "done"
