//! Images built here, with no registry: the busybox and pause images (observer-image's
//! `busybox`) and the agent's own image (the same recipe as `cargo xtask image`), imported with
//! `ctr images import`.
pub use observer_image::busybox::{
    busybox_layer, BUSYBOX_ENV, BUSYBOX_IMAGE, PAUSE_ENTRYPOINT, PAUSE_IMAGE,
};
pub use observer_image::oci::{ctr_import as import, write_oci_archive, ImageSpec};
