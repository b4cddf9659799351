//! TODO

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {}
