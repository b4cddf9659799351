//! Test harness for observer's integration tests and benchmarks: a private containerd with locally
//! built images, pods created through CRI the way kubelet creates them, containerd's own event
//! stream, and the one skip policy every test that needs root or containerd goes through.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use observer_tests::{require_containerd, Containerd, ContainerSpec, PodSpec, Qos};
//! if !require_containerd() {
//!     return Ok(());
//! }
//! let ctrd = Containerd::start().await?;
//! let pod = ctrd
//!     .run_pod(PodSpec::new("x").qos(Qos::Burstable).container(
//!         ContainerSpec::sh("y", "exit 3").memory_limit_mib(32),
//!     ))
//!     .await?;
//! let status = ctrd.wait_exited(pod.container_id("y"), std::time::Duration::from_secs(10)).await?;
//! assert_eq!(status.exit_code, 3);
//! # Ok(()) }
//! ```
// The unit-test build of this library also sees the dev-dependencies its benches use.
#![cfg_attr(test, allow(unused_crate_dependencies))]

// The workload binary's; libraries cannot leave a dependency to one bin target.
use libc as _;
// The deploy test's dev-dependency, which the library's unit tests see too.
#[cfg(test)]
use cel as _;

pub mod agent;
pub mod apiserver;
pub mod bench;
pub mod cluster;
pub mod containerd;
pub mod endpoint;
pub mod events;
pub mod image;
pub mod kernel;
pub mod kubelet;
pub mod large_node;
pub mod manifests;
pub mod pod;
pub mod prereq;
pub mod process;
pub mod prometheus;
pub mod relist;
pub mod stack;
mod sys;
pub mod wait;
pub mod wire;

pub use containerd::{Containerd, StopSignal};
pub use events::{TaskExit, TaskExitStream};
pub use pod::{Container, ContainerSpec, PidMode, Pod, PodSpec, Qos};
pub use prereq::{require_containerd, require_root};
pub use wait::{eventually, eventually_async, poll_until, poll_until_async};

/// Sends a signal to a process (gone already: nothing to do).
pub fn sys_signal(pid: u32, sig: nix::sys::signal::Signal) {
    sys::signal(pid, sig);
}

/// The `observer` binary of this build (`cargo test` at the workspace root builds it beside the
/// test executables).
pub fn observer_bin() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let bin = exe
        .parent()
        .and_then(std::path::Path::parent)
        .expect("target dir")
        .join("observer");
    assert!(
        bin.exists(),
        "{} not built: run the tests from the workspace root (scripts/test.sh), which builds it",
        bin.display()
    );
    bin
}

/// Installs a tracing subscriber once (RUST_LOG, default `info`), writing through the test
/// harness's capture so logs show only for failing tests.
pub fn init_tracing() {
    use std::sync::Once;
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_test_writer()
            .try_init();
    });
}
