//! observer: a node agent that learns container lifecycle from the kernel.
//!
//! Layers, bottom up (each uses only those below it; `tests/layers.rs` checks): [`model`], the
//! shared vocabulary; the utilities ([`sync`], [`mem`], [`ratelimit`], [`runner`], [`sched`]);
//! [`kernel`] (probes, ring buffer, typed events, the kernel log) and [`cgroup`] (what a cgroup
//! path is); [`pleg`] (the node model, kubelet's lifecycle events) and [`cri`] (the runtime);
//! [`pipeline`] (probes → reader → PLEG on its own thread, with the [`pipeline::Hook`] that runs
//! there); [`reconcile`] (the kernel's account merged with the runtime's: the truth); [`kube`]
//! (the API client and reflector); [`status`] (the status manager) and [`fastpath`] (the hook that
//! writes a death from the reader's thread); [`present`] (what people see); [`agent`] (the chain
//! built once); [`cli`] (the binary's subcommands). ARCHITECTURE.md at the repository's root says
//! how the pieces fit.
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
pub mod pressure;
pub mod ratelimit;
pub mod reconcile;
pub mod runner;
pub mod sched;
pub mod status;
pub mod sync;
#[cfg(test)]
pub(crate) mod testlog;

pub use error::{Error, Result};
