#!/usr/bin/env bash
# The whole test suite, as root: installs what is missing, then runs every test of the workspace.
# Kernel and containerd tests run for real; under CI=true none of them may skip.
# Then the kernel and PLEG suites again inside a VM on Debian bookworm's 6.1 kernel with cgroup v2
# only (cargo xtask vm-test; about 3 minutes under software emulation). OBSERVER_VM_TEST=0 skips
# that part outside CI; `cargo xtask vm-test --all` runs the whole kernel × cgroup matrix.
# Last, the real-cluster set (scripts/cluster-test.sh): the suite tests/tests/cluster.rs on a
# Kubernetes built with `go build` (cargo xtask cluster; the first build on a machine takes about 7
# minutes, cached in target/cluster), first on the host's node, then the truth table in conditions
# mode, the status diff and the two nodes' admission test with their pods on a Debian guest node
# under qemu (its image and containerd built once, cached in target/cluster/guest); stopped and
# removed afterwards. Outside CI, OBSERVER_CLUSTER_TEST=0 skips it, OBSERVER_CLUSTER_GUEST=0 the
# guest node. The builds start now, in the background at the lowest priority.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh
export PATH="$HOME/.cargo/bin:$PATH"
# Each phase's time, for the CI budget (60 minutes on 2 cores).
timed() {
  local what=$1 started=$SECONDS
  shift
  "$@"
  echo "timing: $what: $((SECONDS - started)) s"
}
if [ "${OBSERVER_CLUSTER_TEST:-1}" != 0 ] || [ "${CI:-}" = true ]; then
  ./scripts/cluster-build.sh start
fi
# The tests that run the agent's binary (tests/tests/cli.rs, the DaemonSet container test in
# tests/tests/deploy.rs) need target/release/observer: `cargo test` builds a bin only as a test
# harness, and only another target of the same package would make it build the binary itself.
timed "release build" cargo build --release -p observer
# The chart's tests (tests/tests/chart.rs) run helm, built from the Go module proxy by the
# background job first (about 4.5 CPU-minutes the first time, then cached in target/cluster/bin).
# Without the cluster's builds (OBSERVER_CLUSTER_TEST=0 outside CI) they skip, saying so, unless
# helm was built before.
if [ "${OBSERVER_CLUSTER_TEST:-1}" != 0 ] || [ "${CI:-}" = true ]; then
  timed "helm build" ./scripts/cluster-build.sh wait-helm
fi
# Default members: every crate but the eBPF one, which only builds for the BPF target.
# Two cores: more test threads only make the containerd tests slower.
# The real-cluster suite runs last, on its own (its kubelet must not meet the host suites' pods).
timed "host suite" cargo test --release --no-fail-fast -- --test-threads="${TEST_THREADS:-4}" --skip real_cluster:: "$@"
if [ "${OBSERVER_VM_TEST:-1}" = 0 ] && [ "${CI:-}" != true ]; then
  echo "vm-test: skipped (OBSERVER_VM_TEST=0)"
else
  # The guest passes in about 90 s under emulation; a hung one fails in 10 minutes, not 20.
  timed "vm-test" cargo xtask vm-test --kernel amd64 --cgroup v2 --timeout 600
fi
if [ "${OBSERVER_CLUSTER_TEST:-1}" = 0 ] && [ "${CI:-}" != true ]; then
  echo "real-cluster suite: skipped (OBSERVER_CLUSTER_TEST=0)"
else
  timed "real-cluster set" ./scripts/cluster-test.sh
fi
