//! TODO

#[derive(Debug, thiserror::Error)]
pub enum CriError {}
