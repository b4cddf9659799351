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

/// An error with its causes, each once: a cause whose text the message already holds (an I/O
/// error repeated by its wrapper) is not said again.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !text.is_empty() && !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cause = c.source();
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_chain_says_each_cause_once() {
        let io = std::io::Error::from_raw_os_error(111);
        let wrapped = std::io::Error::new(io.kind(), io);
        let shown = super::chain(&wrapped);
        assert_eq!(shown.matches("Connection refused").count(), 1, "{shown}");
    }
}
