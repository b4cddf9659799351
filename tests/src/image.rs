//! Images built here, with no registry: the busybox and pause images (observer-image's
//! `busybox`) and the agent's own image (the same recipe as `cargo xtask image`), imported with
//! `ctr images import`.
use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};
pub use observer_image::busybox::{
    busybox_layer, BUSYBOX_ENV, BUSYBOX_IMAGE, PAUSE_ENTRYPOINT, PAUSE_IMAGE,
};
pub use observer_image::oci::{write_oci_archive, ImageSpec};

/// Imports an archive into containerd's `k8s.io` namespace (where the CRI plugin looks), unpacked
/// for `snapshotter`.
pub fn import(ctr_address: &Path, archive: &Path, snapshotter: &str) -> Result<()> {
    let out = Command::new("ctr")
        .arg("--address")
        .arg(ctr_address)
        .args([
            "-n",
            "k8s.io",
            "images",
            "import",
            "--snapshotter",
            snapshotter,
        ])
        .arg(archive)
        .output()
        .context("running ctr images import")?;
    if !out.status.success() {
        bail!(
            "ctr images import {} failed ({}): {}{}",
            archive.display(),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}
