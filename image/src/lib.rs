//! OCI image archives built without a container engine or a registry, shared by `cargo xtask
//! image` and the tests so that the image the tests run is the image users get:
//!
//! - [`oci`]: the generic writer (an OCI image layout as one tar, which `ctr images import`,
//!   `podman load` and `skopeo copy oci-archive:` read);
//! - [`layer`]: a layer tar with fixed owners and times, so the same files give the same digest;
//! - [`rootfs`]: the run-time file closure of a dynamically linked binary (via `ldd`);
//! - [`agent`]: the agent's image: the `observer` binary and only what it needs to start.
//! - [`busybox`]: the busybox and pause images the tests and the test cluster run.
pub mod agent;
pub mod busybox;
pub mod layer;
pub mod oci;
pub mod rootfs;

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("writing a tar entry {path}: {source}")]
    Tar {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("running {tool}: {detail}")]
    Tool { tool: String, detail: String },
    #[error("encoding JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("{0}")]
    Invalid(String),
}

/// Runs a tool to completion: its output, or an error naming it when it cannot start or fails.
pub(crate) fn run_tool(
    cmd: &mut std::process::Command,
    tool: String,
) -> Result<std::process::Output> {
    match cmd.output() {
        Err(e) => Err(Error::Tool {
            tool,
            detail: e.to_string(),
        }),
        Ok(out) if !out.status.success() => Err(Error::Tool {
            tool,
            detail: format!(
                "{}: {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        }),
        Ok(out) => Ok(out),
    }
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io { path, source }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
