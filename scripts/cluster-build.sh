#!/usr/bin/env bash
# The test cluster's builds in the background, at nice 19 (they take only the CPU the other work
# leaves idle):
#   start        launches the helm, Kubernetes and etcd build (`cargo xtask cluster build`, helm
#                first: the host suite's chart tests need it) and, unless
#                OBSERVER_CLUSTER_GUEST=0 outside CI, the guest node's (`cargo xtask cluster build
#                --guest`: the Debian image, then containerd 2.x, whose `go build` waits for the
#                Kubernetes one); a job that already runs, or whose build is done, costs nothing.
#   wait-helm    returns once helm is built (target/cluster/bin/helm), building it if the background
#                job has not: not waiting for the Kubernetes build that follows it there.
#   wait         waits for the Kubernetes build and fails with its log if it failed.
#   wait-guest   the same for the guest node's build.
# Each build is idempotent and locked: whatever happened in the background, `wait` finishes it or
# says why it cannot. Each job's time is in its log.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
dir=target/cluster
mkdir -p "$dir"

guest_wanted() {
  [ "${OBSERVER_CLUSTER_GUEST:-1}" != 0 ] || [ "${CI:-}" = true ]
}

# launch NAME ARGS...: `xtask cluster ARGS` in the background, its pid in $dir/NAME.pid.
launch() {
  local name=$1
  shift
  if [ -f "$dir/$name.pid" ] && kill -0 "$(cat "$dir/$name.pid")" 2>/dev/null; then
    return 0
  fi
  (
    started=$SECONDS
    nice -n 19 target/debug/xtask cluster "$@"
    echo "cluster-build: $name done in $((SECONDS - started)) s"
  ) >"$dir/$name.log" 2>&1 &
  echo $! >"$dir/$name.pid"
  echo "cluster-build: $name started in the background (log: $dir/$name.log)"
}

# finish NAME ARGS...: waits for the background job, then runs the build itself.
finish() {
  local name=$1
  shift
  if [ -f "$dir/$name.pid" ]; then
    # Returns when that process ends (not a child of this shell: `wait` cannot).
    tail --pid="$(cat "$dir/$name.pid")" -f /dev/null
    rm -f "$dir/$name.pid"
  fi
  if ! cargo xtask cluster "$@"; then
    tail -n 50 "$dir/$name.log" 2>/dev/null || true
    exit 1
  fi
}

case "${1:-}" in
  start)
    # The xtask binary is built first, so that the background builds hold no cargo lock.
    cargo build --quiet -p xtask
    launch build build
    if guest_wanted; then
      launch guest-build build --guest
    fi
    ;;
  wait-helm)
    # The build takes the background job's lock only while helm is missing: once it is built,
    # this returns at once, whatever the job builds next.
    if ! cargo xtask cluster build --only-helm; then
      tail -n 50 "$dir/build.log" 2>/dev/null || true
      exit 1
    fi
    ;;
  wait)
    finish build build
    ;;
  wait-guest)
    finish guest-build build --guest
    ;;
  *)
    echo "usage: $0 start|wait-helm|wait|wait-guest" >&2
    exit 2
    ;;
esac
