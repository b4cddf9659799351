//! The kernel's set of container inits (`KNOWN_INITS`): the group exit of a process in it wakes
//! the ring-buffer reader at once (observer-ebpf/src/wake.rs). The PLEG fills it: a container's
//! init in at its ContainerStarted, out at its ContainerDied. It is what makes an init that is
//! not pid 1 of its own namespace (shareProcessNamespace, ephemeral containers, hostPID), or one
//! whose last thread is not its leader, wake the reader like any other.
use aya::maps::{HashMap, MapData, MapError};
use observer_common::names;

use super::KernelError;

pub struct KnownInits {
    map: HashMap<MapData, u32, u8>,
}

impl KnownInits {
    pub(super) fn new(map: HashMap<MapData, u32, u8>) -> Self {
        Self { map }
    }

    /// Registers a container's init process (its tgid in the node's pid namespace). Fails when
    /// the map is full ([`observer_common::MAX_KNOWN_INITS`]).
    pub fn insert(&mut self, tgid: u32) -> Result<(), KernelError> {
        self.map.insert(tgid, 1, 0).map_err(map_error)
    }

    /// Forgets one; an unknown tgid is not an error.
    pub fn remove(&mut self, tgid: u32) -> Result<(), KernelError> {
        match self.map.remove(&tgid) {
            Err(MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::ENOENT) => {
                Ok(())
            }
            r => r.map_err(map_error),
        }
    }

    pub fn contains(&self, tgid: u32) -> bool {
        self.map.get(&tgid, 0).is_ok()
    }

    /// The registered inits (a walk of the map: for tests and diagnostics).
    pub fn pids(&self) -> Vec<u32> {
        self.map.keys().filter_map(Result::ok).collect()
    }
}

fn map_error(e: MapError) -> KernelError {
    KernelError::Map(names::KNOWN_INITS, e.to_string())
}
