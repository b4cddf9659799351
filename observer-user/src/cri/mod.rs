//! Talking to the container runtime over CRI v1 (containerd, CRI-O).
//!
//! The agent learns about lifecycle from the kernel; the CRI is where it relists to repair its model
//! and where it finds the names the kernel does not know (pod, container, restart count).
//!
//! - [`CriEndpoint`]: where the runtime listens (a path or `unix:///path`).
//! - [`CriClient`]: one connection; every call is bounded by a timeout.
//! - [`ReconnectingCri`]: keeps a [`CriClient`] connected across runtime restarts, with bounded
//!   jittered back-off ([`crate::runner::Backoff`]), and publishes a generation counter so the agent relists after a reconnect.
//! - [`KubeletLabels`]: kubelet's labels and annotations on sandboxes and containers, typed.
mod client;
mod endpoint;
mod labels;
mod reconnect;

use std::path::PathBuf;
use std::time::Duration;

pub use client::{ContainerEventStream, CriClient, CriConfig};
pub use endpoint::CriEndpoint;
pub use k8s_cri::v1 as api;
pub use labels::PodRef;
pub use labels::{keys, KubeletLabels};
pub use reconnect::{ConnectionState, ReconnectingCri};

/// Everything that can go wrong talking to the runtime.
#[derive(Debug, thiserror::Error)]
pub enum CriError {
    #[error("invalid CRI endpoint {endpoint:?}: {reason}")]
    InvalidEndpoint {
        endpoint: String,
        reason: &'static str,
    },
    #[error("CRI socket {path} does not exist")]
    SocketMissing { path: PathBuf },
    #[error("CRI endpoint {path} is not a unix socket")]
    NotASocket { path: PathBuf },
    #[error("connecting to CRI socket {path}")]
    Connect {
        path: PathBuf,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("CRI {call} got no answer within {after:?}")]
    Timeout { call: &'static str, after: Duration },
    /// The runtime does not offer this call (containerd 1.6 and GetContainerEvents). Callers fall
    /// back to something else (relisting, containerd's own event service); it is not a failure of
    /// the runtime.
    #[error("the runtime does not implement CRI {call}")]
    Unimplemented { call: &'static str },
    // The status is in the message and not a `source`: its Display says it all, and error
    // reports that walk the chain would print it twice.
    #[error("CRI {call} failed: {status}")]
    Rpc {
        call: &'static str,
        // Boxed: a tonic::Status is large and would bloat every Result that carries a CriError.
        status: Box<tonic::Status>,
    },
    #[error("not connected to the CRI runtime at {path}: {last_error}")]
    Disconnected { path: PathBuf, last_error: String },
}

impl CriError {
    /// Maps a gRPC status of `call` to an error, keeping Unimplemented apart.
    pub fn from_status(call: &'static str, status: tonic::Status) -> Self {
        if status.code() == tonic::Code::Unimplemented {
            CriError::Unimplemented { call }
        } else {
            CriError::Rpc {
                call,
                status: Box::new(status),
            }
        }
    }

    pub fn is_unimplemented(&self) -> bool {
        matches!(self, CriError::Unimplemented { .. })
    }

    /// The gRPC code when the runtime answered with an error status.
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            CriError::Rpc { status, .. } => Some(status.code()),
            CriError::Unimplemented { .. } => Some(tonic::Code::Unimplemented),
            _ => None,
        }
    }

    /// The message with every cause, for logs and state that keep only a string.
    pub fn chain(&self) -> String {
        crate::model::chain(self)
    }

    /// What the operator should check, for the errors a wrong `--cri-endpoint` gives.
    pub fn hint(&self) -> Option<&'static str> {
        match self {
            CriError::SocketMissing { .. } => Some("is the runtime running, and is --cri-endpoint (OBSERVER_CRI_ENDPOINT) its socket? containerd: /run/containerd/containerd.sock, CRI-O: /var/run/crio/crio.sock"),
            CriError::NotASocket { .. } => Some("--cri-endpoint (OBSERVER_CRI_ENDPOINT) must be the runtime's unix socket"),
            CriError::Connect { .. }
            | CriError::Rpc { .. }
            | CriError::Unimplemented { .. }
            | CriError::Timeout { .. } => Some("the socket does not answer CRI Version: is the runtime running, and is --cri-endpoint (OBSERVER_CRI_ENDPOINT) its CRI socket?"),
            _ => None,
        }
    }

    /// The runtime said the object does not exist (e.g. a container removed since the last list).
    pub fn is_not_found(&self) -> bool {
        self.code() == Some(tonic::Code::NotFound)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unimplemented_status_is_its_own_variant() {
        let e = CriError::from_status(
            "GetContainerEvents",
            tonic::Status::unimplemented("unknown method"),
        );
        assert!(e.is_unimplemented());
        assert!(matches!(
            e,
            CriError::Unimplemented {
                call: "GetContainerEvents"
            }
        ));
    }

    #[test]
    fn other_status_is_rpc_with_code() {
        let e = CriError::from_status("ContainerStatus", tonic::Status::not_found("no such"));
        assert!(!e.is_unimplemented());
        assert!(e.is_not_found());
        assert_eq!(e.code(), Some(tonic::Code::NotFound));
        assert!(e.to_string().contains("ContainerStatus"), "{e}");
    }

    #[test]
    fn error_stays_small() {
        // Every CRI call returns Result<_, CriError>; keep it cheap to move.
        assert!(std::mem::size_of::<CriError>() <= 64);
    }
}
