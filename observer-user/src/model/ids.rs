//! Pod and container ids, in the forms kubelet and the runtimes write them. Inline and `Copy`:
//! cgroup classification parses one per cgroup event on the node, and events carry them.
use std::{fmt, str::FromStr};

/// A string that is not an id of the kind asked for.
#[derive(Debug, thiserror::Error)]
pub enum IdError {
    #[error("invalid pod uid {0:?}")]
    PodUid(String),
    #[error("invalid container id {0:?}")]
    ContainerId(String),
}

fn is_lower_hex(b: u8) -> bool {
    b.is_ascii_digit() || (b'a'..=b'f').contains(&b)
}

/// A pod UID in its API form: a dashed lowercase UUID (`8-4-4-4-12`), or the 32 lowercase hex
/// digits kubelet gives static pods read from files (an md5 sum, no dashes).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodUid {
    bytes: [u8; 36],
    len: u8,
}

const UUID_DASHES: [usize; 4] = [8, 13, 18, 23];

impl PodUid {
    /// Parses the API form; `None` for anything else (uppercase, wrong length, stray characters).
    pub fn parse(s: &str) -> Option<PodUid> {
        Self::parse_with_sep(s.as_bytes(), b'-')
    }

    /// `sep` is what stands for '-' in the source: the systemd driver writes '_' because '-'
    /// separates slice levels.
    pub(crate) fn parse_with_sep(b: &[u8], sep: u8) -> Option<PodUid> {
        let mut bytes = [0u8; 36];
        match b.len() {
            32 if b.iter().all(|&c| is_lower_hex(c)) => {
                bytes[..32].copy_from_slice(b);
                Some(PodUid { bytes, len: 32 })
            }
            36 => {
                for (i, &c) in b.iter().enumerate() {
                    if UUID_DASHES.contains(&i) {
                        if c != sep {
                            return None;
                        }
                        bytes[i] = b'-';
                    } else if is_lower_hex(c) {
                        bytes[i] = c;
                    } else {
                        return None;
                    }
                }
                Some(PodUid { bytes, len: 36 })
            }
            _ => None,
        }
    }

    pub fn as_str(&self) -> &str {
        // Only ASCII hex digits and '-' are ever stored.
        std::str::from_utf8(&self.bytes[..self.len as usize]).unwrap_or("")
    }
}

impl FromStr for PodUid {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PodUid::parse(s).ok_or_else(|| IdError::PodUid(s.to_owned()))
    }
}

impl fmt::Display for PodUid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for PodUid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PodUid({})", self.as_str())
    }
}

/// A container id as the runtimes put it in cgroup names: 64 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ContainerId([u8; 64]);

impl ContainerId {
    /// No container: 64 zeros, an id no runtime gives (the sandbox of a pod the runtime has no
    /// sandbox for).
    pub const NONE: ContainerId = ContainerId([b'0'; 64]);

    pub fn parse(s: &str) -> Option<ContainerId> {
        Self::parse_bytes(s.as_bytes())
    }

    pub(crate) fn parse_bytes(b: &[u8]) -> Option<ContainerId> {
        let arr: [u8; 64] = b.try_into().ok()?;
        arr.iter()
            .all(|&c| is_lower_hex(c))
            .then_some(ContainerId(arr))
    }

    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).unwrap_or("")
    }
}

impl FromStr for ContainerId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ContainerId::parse(s).ok_or_else(|| IdError::ContainerId(s.to_owned()))
    }
}

impl fmt::Display for ContainerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for ContainerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ContainerId({})", self.as_str())
    }
}
