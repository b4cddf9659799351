#!/usr/bin/env bash
# The whole test suite, as root: installs what is missing, then runs every test of the workspace.
# Kernel and containerd tests run for real; under CI=true none of them may skip.
# Then the kernel and PLEG suites again inside a VM on Debian bookworm's 6.1 kernel with cgroup v2
# only (cargo xtask vm-test; about 3 minutes under software emulation). OBSERVER_VM_TEST=0 skips
# that part outside CI; `cargo xtask vm-test --all` runs the whole kernel × cgroup matrix.
# Last, the real-cluster suite (tests/tests/cluster.rs) on a one-node Kubernetes built with
# `go build` (cargo xtask cluster; the first build on a machine takes about 7 minutes, cached in
# target/cluster), stopped and removed afterwards. OBSERVER_CLUSTER_TEST=0 skips it outside CI.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh
export PATH="$HOME/.cargo/bin:$PATH"
if [ "${OBSERVER_CLUSTER_TEST:-1}" != 0 ] || [ "${CI:-}" = true ]; then
  ./scripts/cluster-build.sh start
fi
# The tests that run the agent's binary (tests/tests/cli.rs, the DaemonSet container test in
# tests/tests/deploy.rs) need target/release/observer: `cargo test` builds a bin only as a test
# harness, and only another target of the same package would make it build the binary itself.
cargo build --release -p observer
# Default members: every crate but the eBPF one, which only builds for the BPF target.
# Two cores: more test threads only make the containerd tests slower.
# The real-cluster suite runs last, on its own (its kubelet must not meet the host suites' pods).
cargo test --release --no-fail-fast -- --test-threads="${TEST_THREADS:-4}" --skip real_cluster:: "$@"
if [ "${OBSERVER_VM_TEST:-1}" = 0 ] && [ "${CI:-}" != true ]; then
  echo "vm-test: skipped (OBSERVER_VM_TEST=0)"
else
  # The guest passes in about 90 s under emulation; a hung one fails in 10 minutes, not 20.
  cargo xtask vm-test --kernel amd64 --cgroup v2 --timeout 600
fi
if [ "${OBSERVER_CLUSTER_TEST:-1}" = 0 ] && [ "${CI:-}" != true ]; then
  echo "real-cluster suite: skipped (OBSERVER_CLUSTER_TEST=0)"
else
  ./scripts/cluster-build.sh wait
  cargo xtask cluster up
  trap 'cargo xtask cluster down' EXIT
  cargo test --release -p observer-tests --test cluster -- --test-threads=2
fi
