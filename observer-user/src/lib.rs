//! observer: a node agent that learns container lifecycle from the kernel.
//!
//! Layers, bottom up: [`kernel`] loads the eBPF programs and turns ring-buffer records into typed
//! [`kernel::KernelEvent`]s; [`cgroup`] tells which pod and container a cgroup path belongs to;
//! [`pleg`] keeps the node model and emits pod lifecycle events; [`cri`] talks to the container
//! runtime and reconciles; [`cli`] holds the subcommands of the `observer` binary.
pub mod agent;
pub mod cgroup;
pub mod cli;
pub mod cri;
pub mod error;
pub mod kernel;
pub mod kube;
pub mod pleg;
pub mod reconcile;
pub mod runner;
pub mod status;
#[cfg(test)]
pub(crate) mod testutil;

pub use error::{Error, Result};
