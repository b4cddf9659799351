#!/usr/bin/env bash
# The test cluster's Go build in the background: `start` launches it at nice 19 (it takes only the
# CPU the other work leaves idle) unless it already runs or is done; `wait` waits for it and fails
# with its log if it failed. The build itself is `cargo xtask cluster build` (idempotent, locked).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
dir=target/cluster
mkdir -p "$dir"
case "${1:-}" in
  start)
    if [ -f "$dir/build.pid" ] && kill -0 "$(cat "$dir/build.pid")" 2>/dev/null; then
      exit 0
    fi
    # The xtask binary is built first, so that the background build holds no cargo lock.
    cargo build --quiet -p xtask
    nice -n 19 target/debug/xtask cluster build >"$dir/build.log" 2>&1 &
    echo $! >"$dir/build.pid"
    echo "cluster-build: started in the background (log: $dir/build.log)"
    ;;
  wait)
    if [ -f "$dir/build.pid" ]; then
      pid=$(cat "$dir/build.pid")
      # Returns when that process ends (not a child of this shell: `wait` cannot).
      tail --pid="$pid" -f /dev/null
      rm -f "$dir/build.pid"
    fi
    # Whatever happened in the background, this finishes the build or says why it cannot.
    if ! cargo xtask cluster build; then
      tail -n 50 "$dir/build.log" 2>/dev/null || true
      exit 1
    fi
    ;;
  *)
    echo "usage: $0 start|wait" >&2
    exit 2
    ;;
esac
