//! observer: a node agent that learns container lifecycle from the kernel.
//!
//! Layers, bottom up: [`kernel`] loads the eBPF programs and turns ring-buffer records into typed
//! [`kernel::KernelEvent`]s; [`cgroup`] tells which pod and container a cgroup path belongs to;
//! [`pleg`] keeps the node model and emits pod lifecycle events; [`pipeline`] wires those three
//! once; [`cri`] talks to the container runtime; [`reconcile`] merges the runtime's account with
//! the kernel's; [`runner`] is the per-key job runner the reconciler (and the status manager)
//! schedule work with; [`ratelimit`] keeps one pod from flooding Events or logs; [`sched`] makes
//! the kernel reader's thread real-time; [`agent`] starts it all; [`cli`] holds the subcommands of
//! the `observer`
//! binary. ARCHITECTURE.md at the repository's root says how the pieces fit.
pub mod agent;
pub mod cgroup;
pub mod cli;
pub mod cri;
pub mod error;
mod exposition;
pub mod fastpath;
pub mod kernel;
pub mod kube;
pub mod mem;
pub mod model;
pub mod pipeline;
pub mod pleg;
pub mod present;
pub mod ratelimit;
pub mod reconcile;
pub mod runner;
pub mod sched;
pub mod status;
pub mod sync;
#[cfg(test)]
pub(crate) mod testlog;

pub use error::{Error, Result};
