//! The run-time file closure of a binary now lives in `observer-image`, shared with the tests'
//! image builder; re-exported here for the tasks that build root filesystems.
pub(crate) use observer_image::rootfs::runtime_files;
