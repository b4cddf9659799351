//! The kernel's set of container inits (their exit wakes the reader at once) kept in step with
//! the PLEG: a pid is written to the kernel's map only when it changes, and a failed write (the
//! map full) is counted and logged once; that init's exit then comes within the poll period.
use std::collections::HashSet;

use crate::{
    kernel::{KernelError, KnownInits},
    pleg::InitChange,
};

/// The kernel's set, behind a trait so that the bookkeeping is tested without a kernel.
pub(super) trait InitSet {
    fn insert(&mut self, pid: u32) -> Result<(), KernelError>;
    fn remove(&mut self, pid: u32) -> Result<(), KernelError>;
}

impl InitSet for KnownInits {
    fn insert(&mut self, pid: u32) -> Result<(), KernelError> {
        KnownInits::insert(self, pid)
    }
    fn remove(&mut self, pid: u32) -> Result<(), KernelError> {
        KnownInits::remove(self, pid)
    }
}

#[derive(Default)]
pub(super) struct InitSync {
    /// What the kernel's set holds.
    registered: HashSet<u32>,
    pub(super) failures: u64,
}

impl InitSync {
    pub(super) fn apply(
        &mut self,
        set: &mut impl InitSet,
        changes: impl IntoIterator<Item = InitChange>,
    ) {
        for change in changes {
            let r = match change {
                InitChange::Started(pid) if self.registered.insert(pid) => {
                    set.insert(pid).inspect_err(|_| {
                        self.registered.remove(&pid);
                    })
                }
                InitChange::Died(pid) if self.registered.remove(&pid) => set.remove(pid),
                _ => Ok(()),
            };
            if let Err(e) = r {
                if self.failures == 0 {
                    tracing::warn!(
                        "container init not registered with the kernel (logged once, \
                         counted): {e}; its exit is read within the poll period instead"
                    );
                }
                self.failures += 1;
            }
        }
    }

    pub(super) fn len(&self) -> usize {
        self.registered.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's map with room for `room` pids, and every write made to it.
    #[derive(Default)]
    struct Map {
        room: usize,
        pids: HashSet<u32>,
        writes: Vec<String>,
    }

    impl Map {
        fn with_room(room: usize) -> Self {
            Self {
                room,
                ..Self::default()
            }
        }
    }

    impl InitSet for Map {
        fn insert(&mut self, pid: u32) -> Result<(), KernelError> {
            self.writes.push(format!("+{pid}"));
            if self.pids.len() >= self.room {
                return Err(KernelError::Io(std::io::Error::from_raw_os_error(
                    libc::E2BIG,
                )));
            }
            self.pids.insert(pid);
            Ok(())
        }
        fn remove(&mut self, pid: u32) -> Result<(), KernelError> {
            self.writes.push(format!("-{pid}"));
            self.pids.remove(&pid);
            Ok(())
        }
    }

    use InitChange::{Died, Started};

    #[test]
    fn the_map_is_written_only_on_a_change() {
        let mut map = Map::with_room(8);
        let mut sync = InitSync::default();
        sync.apply(
            &mut map,
            [Started(10), Started(10), Died(11), Died(10), Died(10)],
        );
        assert_eq!(map.writes, ["+10", "-10"]);
        assert_eq!((sync.len(), sync.failures), (0, 0));
    }

    #[test]
    fn a_full_map_is_counted_and_the_pid_tried_again_at_its_next_start() {
        let mut map = Map::with_room(1);
        let mut sync = InitSync::default();
        sync.apply(&mut map, [Started(1), Started(2), Started(3)]);
        assert_eq!(sync.failures, 2);
        assert_eq!(sync.len(), 1, "only what the kernel holds is registered");
        // A death of a pid the kernel never held writes nothing.
        sync.apply(&mut map, [Died(2)]);
        assert_eq!(map.writes, ["+1", "+2", "+3"]);
        // Room again: the next start of the same pid is written.
        sync.apply(&mut map, [Died(1), Started(2)]);
        assert_eq!(map.writes, ["+1", "+2", "+3", "-1", "+2"]);
        assert_eq!((sync.len(), sync.failures), (1, 2));
    }
}
