//! The kernel-driven PLEG: kernel events in, pod lifecycle events out, no polling.
//!
//! [`Pleg`] owns the [`NodeModel`] and the cgroup id index, feeds each kernel event through the
//! model's state machine, holds events whose cgroup is not known yet (and replays them once its
//! mkdir arrives), and sends what comes out into a bounded [`stream`].
pub mod event;
pub mod model;
pub mod stream;

use std::collections::{HashMap, HashSet, VecDeque};

pub use event::{ContainerExit, Death, ExitReason, PlegEvent, PlegEventType, PodLifecycleEvent};
pub use model::Applied;
pub use model::ContainerRecord;
pub use model::ContainerState;
pub use model::NodeModel;
pub use model::PodRecord;
pub(crate) use stream::LagCounter;
pub use stream::{channel, PlegReceiver, PlegSender, Stamped};

use crate::{
    cgroup::{CgroupError, CgroupIndex, IndexStats, Scan, ScanOptions},
    kernel::{BootClock, BootNs, KernelEvent},
};

/// How long an event for a not-yet-known cgroup is held for its mkdir.
const ORPHAN_TTL_NS: u64 = 2_000_000_000;
/// At most this many events are held at once; beyond, the oldest are dropped (and counted).
const ORPHAN_CAP: usize = 4096;
/// Removed cgroup ids remembered so that late events for them are told apart from unknown ones.
const TOMBSTONES: usize = 4096;

/// A container's init came or went, for the kernel's set of known inits (whose exit wakes the
/// reader at once: `kernel::KnownInits`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum InitChange {
    /// ContainerStarted: this process is a container's init.
    Started(u32),
    /// ContainerDied: it is not any more.
    Died(u32),
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PlegStats {
    pub kernel_events: u64,
    pub lifecycle_events: u64,
    /// Events about a cgroup nobody could name, dropped after waiting for its mkdir.
    pub unattributed: u64,
    /// Events held for their cgroup's mkdir and then applied.
    pub replayed: u64,
    /// Events about containers already exited or removed.
    pub late: u64,
    /// Records the kernel dropped (ring buffer full), each a reason to resync.
    pub lost_records: u64,
    /// Events about cgroups shaped like kubelet's outside its roots (`CgroupKind::Foreign`):
    /// ignored.
    pub outside_roots: u64,
    pub resyncs: u64,
    /// Kernel events by [`KernelEvent::type_index`] and lifecycle events by
    /// [`PlegEventType::index`].
    pub kernel_by_type: [u64; KernelEvent::TYPES.len()],
    pub lifecycle_by_type: [u64; PlegEventType::ALL.len()],
    /// The cgroup index's look-ups of ids it did not hold.
    pub index: IndexStats,
}

pub struct Pleg {
    model: NodeModel,
    cgroups: CgroupIndex,
    /// Lifecycle events made since the last [`Pleg::take_events`], in order.
    out: Vec<PodLifecycleEvent>,
    orphans: HashMap<u64, Vec<KernelEvent>>,
    orphan_order: VecDeque<(u64, BootNs)>,
    orphan_count: usize,
    tombstones: HashSet<u64>,
    tombstone_order: VecDeque<u64>,
    scratch: Vec<PodLifecycleEvent>,
    init_changes: Vec<InitChange>,
    stats: PlegStats,
    needs_resync: bool,
}

impl Pleg {
    /// A PLEG over `cgroups`, whose roots say which cgroups are kubelet's.
    pub fn new(cgroups: CgroupIndex) -> Self {
        Self {
            model: NodeModel::new(cgroups.roots().clone()),
            cgroups,
            out: Vec::new(),
            orphans: HashMap::new(),
            orphan_order: VecDeque::new(),
            orphan_count: 0,
            tombstones: HashSet::new(),
            tombstone_order: VecDeque::new(),
            scratch: Vec::new(),
            init_changes: Vec::new(),
            stats: PlegStats::default(),
            needs_resync: false,
        }
    }

    /// Sets the depth of the node's own pid namespace (see [`NodeModel::set_host_ns_level`]).
    pub(crate) fn set_host_ns_level(&mut self, level: u32) {
        self.model.set_host_ns_level(level);
    }

    pub fn model(&self) -> &NodeModel {
        &self.model
    }

    pub fn cgroups(&self) -> &CgroupIndex {
        &self.cgroups
    }

    pub fn stats(&self) -> PlegStats {
        PlegStats {
            index: self.cgroups.stats(),
            ..self.stats
        }
    }

    /// True after the kernel dropped records: the caller should walk the cgroup tree and call
    /// [`Self::resync`] (and relist the runtime).
    pub(crate) fn needs_resync(&self) -> bool {
        self.needs_resync
    }

    /// Applies a fresh walk of the cgroup tree: at start, so containers started before the agent
    /// are known with their init; and after lost events.
    pub fn resync(&mut self, scan: &Scan) {
        for c in &scan.cgroups {
            self.cgroups.insert(c.id, &c.path);
        }
        self.model.resync(scan, BootClock::now(), &mut self.scratch);
        self.stats.resyncs += 1;
        self.needs_resync = false;
        self.flush();
    }

    /// Walks the cgroup tree below kubelet's roots (absent ones are skipped) and resyncs with
    /// what it finds.
    pub(crate) fn rescan(&mut self) -> Result<(), CgroupError> {
        let scan = crate::cgroup::scan(
            self.cgroups.mount(),
            self.cgroups.roots(),
            &ScanOptions::default(),
        )?;
        self.resync(&scan);
        Ok(())
    }

    pub fn handle(&mut self, ev: KernelEvent) {
        self.stats.kernel_events += 1;
        self.stats.kernel_by_type[ev.type_index()] += 1;
        self.expire_orphans(ev.at());
        match &ev {
            KernelEvent::CgroupMkdir(c) => {
                self.cgroups.insert(c.id, &c.path);
                self.tombstones.remove(&c.id);
            }
            KernelEvent::Lost { records, .. } => {
                self.stats.lost_records += records;
                self.needs_resync = true;
            }
            _ => {}
        }
        let mkdir_id = match &ev {
            KernelEvent::CgroupMkdir(c) => Some(c.id),
            _ => None,
        };
        let rmdir_id = match &ev {
            KernelEvent::CgroupRmdir(c) => Some(c.id),
            _ => None,
        };
        self.apply(ev);
        if let Some(id) = mkdir_id {
            if let Some(held) = self.orphans.remove(&id) {
                self.orphan_count -= held.len();
                self.stats.replayed += held.len() as u64;
                for ev in held {
                    self.apply(ev);
                }
            }
        }
        if let Some(id) = rmdir_id {
            self.cgroups.remove(id);
            self.bury(id);
        }
        self.flush();
    }

    fn apply(&mut self, ev: KernelEvent) {
        let cgroups = &mut self.cgroups;
        let tombstones = &self.tombstones;
        let mut resolve = |id: u64| {
            if tombstones.contains(&id) {
                None
            } else {
                cgroups.resolve(id).cloned()
            }
        };
        match self.model.apply(&ev, &mut resolve, &mut self.scratch) {
            Applied::UnknownCgroup(id) if self.tombstones.contains(&id) => self.stats.late += 1,
            Applied::UnknownCgroup(id) => self.hold(id, ev),
            Applied::Late => self.stats.late += 1,
            Applied::OutsideRoots(id) => self.outside_roots(id, &ev),
            Applied::Done | Applied::NotAContainer => {}
        }
    }

    /// An event about a cgroup named like a pod's or a container's outside kubelet's roots:
    /// whoever can write that subtree made it, so it changes nothing. Counted; said once (on
    /// this thread a warning per event could stall it behind stderr).
    fn outside_roots(&mut self, id: u64, ev: &KernelEvent) {
        if self.stats.outside_roots == 0 {
            let path = match ev {
                KernelEvent::CgroupMkdir(c)
                | KernelEvent::CgroupRmdir(c)
                | KernelEvent::CgroupEmpty(c) => Some(c.path.clone()),
                _ => self.cgroups.get(id).map(|e| e.path.to_string()),
            };
            tracing::warn!(
                cgroup_id = id,
                // Debug: a name is anybody's choice, escapes included.
                path = ?path.as_deref().unwrap_or("?"),
                roots = %self.cgroups.roots(),
                "a cgroup named like a pod's or a container's is outside kubelet's cgroups: \
                 ignored (counted in observer_pleg_outside_roots_events_total; said once). Made \
                 by whoever can write that subtree, it is never taken for a container. If \
                 kubelet's pods are there, give its --cgroup-root (OBSERVER_CGROUP_ROOT)"
            );
        }
        self.stats.outside_roots += 1;
    }

    fn hold(&mut self, id: u64, ev: KernelEvent) {
        if self.orphan_count >= ORPHAN_CAP {
            self.drop_oldest_orphans(1);
        }
        self.orphan_order.push_back((id, ev.at()));
        self.orphans.entry(id).or_default().push(ev);
        self.orphan_count += 1;
    }

    fn expire_orphans(&mut self, now: BootNs) {
        while let Some(&(_, at)) = self.orphan_order.front() {
            if now.0.saturating_sub(at.0) < ORPHAN_TTL_NS {
                break;
            }
            self.drop_oldest_orphans(1);
        }
    }

    fn drop_oldest_orphans(&mut self, n: usize) {
        for _ in 0..n {
            let Some((id, _)) = self.orphan_order.pop_front() else {
                return;
            };
            let Some(list) = self.orphans.get_mut(&id) else {
                continue;
            };
            if list.is_empty() {
                continue;
            }
            list.remove(0);
            self.orphan_count -= 1;
            if list.is_empty() {
                self.orphans.remove(&id);
            }
            if self.stats.unattributed == 0 {
                tracing::warn!(
                    cgroup_id = id,
                    "kernel event for a cgroup that never appeared: dropped (counted; logged once)"
                );
            }
            self.stats.unattributed += 1;
        }
    }

    fn bury(&mut self, id: u64) {
        if self.tombstones.insert(id) {
            self.tombstone_order.push_back(id);
            if self.tombstone_order.len() > TOMBSTONES {
                if let Some(old) = self.tombstone_order.pop_front() {
                    self.tombstones.remove(&old);
                }
            }
        }
    }

    fn flush(&mut self) {
        self.stats.lifecycle_events += self.scratch.len() as u64;
        for ev in self.scratch.drain(..) {
            self.stats.lifecycle_by_type[ev.kind().index()] += 1;
            match &ev.event {
                PlegEvent::ContainerStarted { pid, .. } => {
                    self.init_changes.push(InitChange::Started(*pid));
                }
                PlegEvent::ContainerDied {
                    exit: ContainerExit { pid: Some(pid), .. },
                    ..
                } => self.init_changes.push(InitChange::Died(*pid)),
                _ => {}
            }
            self.out.push(ev);
        }
    }

    /// The lifecycle events made since the last call, in order: the caller hands them on (the
    /// pipeline shows each to its hook, then queues them for the consumer).
    pub fn take_events(&mut self) -> std::vec::Drain<'_, PodLifecycleEvent> {
        self.out.drain(..)
    }

    /// The inits that started and died since the last call, in order. A running container reaches
    /// Exited through a ContainerDied before it is forgotten, so what goes in comes out (one
    /// left behind would only cost a needless wake-up, should its pid exit again).
    pub(crate) fn take_init_changes(&mut self) -> std::vec::Drain<'_, InitChange> {
        self.init_changes.drain(..)
    }

    /// Events currently held for their cgroup's mkdir.
    pub fn held(&self) -> usize {
        self.orphan_count
    }
}

#[cfg(test)]
mod tests;
