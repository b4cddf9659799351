#!/usr/bin/env bash
# The whole real-cluster set, as root: the host node's suite, then a Debian guest node joins and
# the suites that run with their pods there; the cluster is stopped and removed at the end, passed
# or failed. scripts/test.sh runs it last (and so CI). Each phase prints its time ("timing:").
#
#   ./scripts/cluster-test.sh              the host node's whole suite (tests/tests/cluster.rs),
#                                          then on the guest (observer-node-2): the truth table in
#                                          conditions mode, the status diff, the two nodes'
#                                          admission test, the memory warnings
#   OBSERVER_CLUSTER_GUEST=0 ...           the host node alone (outside CI only)
#   OBSERVER_CLUSTER_GUEST_ALL=1 ...       on the guest also the audit-mode truth table and the 100
#                                          lifecycles (about 5 minutes and, by the pace of the first
#                                          wave, 45 minutes more under emulation: docs/second-node.md)
#
# The builds (Kubernetes, the guest's image and containerd) are cached under target/cluster and
# redone only when their inputs change; scripts/cluster-build.sh starts them in the background.
# Arguments go to the host suite's test binary (a filter, --nocapture).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

guest=1
if [ "${OBSERVER_CLUSTER_GUEST:-1}" = 0 ] && [ "${CI:-}" != true ]; then
  guest=0
fi

timed() {
  local what=$1 started=$SECONDS
  shift
  "$@"
  echo "timing: $what: $((SECONDS - started)) s"
}

# Started by .ci/run or scripts/test.sh already; started here when this script runs alone.
./scripts/cluster-build.sh start
timed "waiting for the cluster's build" ./scripts/cluster-build.sh wait
# The suites deploy the release binary; one older than its sources would make them skip.
timed "release build" cargo build --release -p observer
trap 'cargo xtask cluster down' EXIT
timed "cluster up (host node)" cargo xtask cluster up
timed "real-cluster suite, host node" \
  cargo test --release --test cluster -- --test-threads=2 "$@"

if [ "$guest" = 0 ]; then
  echo "real-cluster suite on the guest node: skipped (OBSERVER_CLUSTER_GUEST=0)"
  exit 0
fi
timed "waiting for the guest's build (image, containerd)" ./scripts/cluster-build.sh wait-guest
timed "guest node boot and join" cargo xtask cluster up --nodes 2
guest_tests=(real_cluster::truth::truth_table_conditions_mode real_cluster::status_diff
             real_cluster::two_nodes real_cluster::memory)
if [ "${OBSERVER_CLUSTER_GUEST_ALL:-0}" = 1 ]; then
  guest_tests+=(real_cluster::truth::truth_table_audit_mode real_cluster::cycles)
fi
# The agent is deployed to both nodes by the suite itself (its image built from the release
# binary under test). `--include-ignored`: the two nodes' test is ignored in the host suite. One
# test at a time: the emulated guest starts pods slowly enough without two tests' pods at once.
timed "real-cluster suite, guest node" env OBSERVER_CLUSTER_NODE=observer-node-2 \
  cargo test --release --test cluster -- --include-ignored --test-threads=1 \
  "${guest_tests[@]}"
