//! The library's one error type. Each layer has its own enum; this wraps them so callers of the
//! library match on one type and the binary turns it into a report at its edge.
use thiserror::Error;

#[derive(Debug, Error)]
pub enum Error {
    #[error(transparent)]
    Kernel(#[from] crate::kernel::KernelError),
    #[error(transparent)]
    Cgroup(#[from] crate::cgroup::CgroupError),
    #[error(transparent)]
    Cri(#[from] crate::cri::CriError),
    #[error(transparent)]
    Pipeline(#[from] crate::pipeline::PipelineError),
    /// The HTTP endpoint's address could not be bound.
    #[error("{0}")]
    Listen(std::io::Error),
    /// A part of the agent stopped running.
    #[error("{0}")]
    Stopped(String),
    #[error(transparent)]
    State(#[from] crate::reconcile::inits::StateError),
    #[error(transparent)]
    Kube(#[from] crate::kube::KubeError),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
