#!/usr/bin/env bash
# The whole test suite, as root: installs what is missing, then runs every test of the workspace.
# Kernel and containerd tests run for real; under CI=true none of them may skip.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh
export PATH="$HOME/.cargo/bin:$PATH"
# The tests that run the agent's binary (tests/tests/cli.rs, the DaemonSet container test in
# tests/tests/deploy.rs) need target/release/observer: `cargo test` builds a bin only as a test
# harness, and only another target of the same package would make it build the binary itself.
cargo build --release -p observer
# Default members: every crate but the eBPF one, which only builds for the BPF target.
# Two cores: more test threads only make the containerd tests slower.
cargo test --release --no-fail-fast -- --test-threads="${TEST_THREADS:-4}" "$@"
