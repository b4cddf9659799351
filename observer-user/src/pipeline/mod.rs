//! The kernel half of the agent, wired once: probes → ring-buffer reader → PLEG, with the
//! start-up walk of the cgroup tree and a rescan whenever the kernel dropped records. Every
//! consumer uses this one type: the agent ([`KernelPipeline::spawn`], on a thread of its own),
//! `observer watch --pods`, the kernel tests and the benches
//! ([`KernelPipeline::next_batch`]). One turn of the loop is [`KernelPipeline::next_batch`] on a
//! tokio runtime and [`KernelPipeline::next_batch_blocking`] on a thread; both hand the batch to
//! the same code.
mod hook;
mod inits;
mod metrics;
mod outbox;
mod task;

use std::{
    os::fd::BorrowedFd,
    path::Path,
    sync::{Arc, Mutex},
    time::Duration,
};

pub use hook::{Hook, HookFactory};
pub use task::PipelineHealth;
pub(crate) use task::HEARTBEAT;
pub use task::{PipelineTask, ReaderThread};

use crate::{
    cgroup::{cgroup_id, CgroupError, CgroupIndex, CgroupMounts, HierarchyMount, KubeRoots},
    kernel::{
        EventReader, KernelCounters, KernelError, KernelEvent, KnownInits, ProbeOptions, Probes,
        Wait, Watch, WatchRoot,
    },
    model::BootClock,
    pleg::{self, Pleg, PlegReceiver, PlegStats},
};
use inits::InitSync;
use outbox::Outbox;

#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    #[error("no cgroup2 hierarchy is mounted: observer attributes events by cgroup2 ids; boot the node with the unified (cgroup v2) or hybrid hierarchy")]
    NoCgroup2,
    #[error("the kernel pipeline task panicked: {0}")]
    Panicked(String),
}

/// Capacity of the PLEG stream before a lagging consumer's events are coalesced per pod.
pub const DEFAULT_QUEUE: usize = 64 * 1024;

#[derive(Clone, Debug)]
pub struct PipelineConfig {
    /// The cgroup2 hierarchy events are attributed in.
    pub unified: HierarchyMount,
    /// kubelet's kubepods cgroups: only below them is a cgroup a pod's or a container's. Walked
    /// at start and after lost records; absent ones are skipped (kubelet may make them later).
    pub roots: KubeRoots,
    pub probes: ProbeOptions,
    pub queue: usize,
}

impl PipelineConfig {
    /// kubelet's pods: its roots in the host's cgroup2 hierarchy (mounted under `cgroupfs` when
    /// the agent runs in a container), as `given` (`--cgroup-root`) or found
    /// ([`KubeRoots::detect`]), are walked and are the kernel's filter; with none there yet (no
    /// pod ever ran here), every process is watched, which stays correct when kubelet makes
    /// them, only busier.
    pub fn kubepods<S: AsRef<str>>(
        cgroupfs: Option<&Path>,
        given: &[S],
    ) -> Result<Self, PipelineError> {
        let unified = unified_mount(cgroupfs)?;
        let roots = KubeRoots::detect(&unified, given)?;
        let watch = watch_of(&unified, roots.paths())?;
        Ok(Self {
            roots,
            probes: ProbeOptions {
                watch,
                ..Default::default()
            },
            unified,
            queue: DEFAULT_QUEUE,
        })
    }
}

/// The cgroup2 hierarchy, under `cgroupfs` when given.
pub fn unified_mount(cgroupfs: Option<&Path>) -> Result<HierarchyMount, PipelineError> {
    CgroupMounts::detect(cgroupfs)?
        .unified()
        .cloned()
        .ok_or(PipelineError::NoCgroup2)
}

/// The kernel filter for `roots` (relative to the cgroup2 root): those that exist, or every
/// process when none does.
pub(crate) fn watch_of<S: AsRef<str>>(
    unified: &HierarchyMount,
    roots: impl IntoIterator<Item = S>,
) -> Result<Watch, CgroupError> {
    let present = watch_roots(unified, roots)?;
    Ok(if present.is_empty() {
        Watch::All
    } else {
        Watch::Roots(present)
    })
}

/// The `WatchRoot`s (cgroup id and depth) of those of `roots` that exist.
pub fn watch_roots<S: AsRef<str>>(
    unified: &HierarchyMount,
    roots: impl IntoIterator<Item = S>,
) -> Result<Vec<WatchRoot>, CgroupError> {
    let mut out = Vec::new();
    for rel in roots {
        let rel = rel.as_ref();
        let Some(abs) = unified.to_absolute(rel).filter(|p| p.is_dir()) else {
            continue;
        };
        out.push(WatchRoot {
            id: cgroup_id(&abs)?,
            level: rel.split('/').filter(|c| !c.is_empty()).count() as u32,
            _pad: 0,
        });
    }
    Ok(out)
}

/// What one [`KernelPipeline::next_batch`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Batch {
    /// Kernel events read and handed to the PLEG.
    pub events: usize,
    /// The kernel had dropped records: the cgroup tree was walked again and the PLEG resynced.
    /// Whoever mirrors the runtime should relist it now.
    pub resynced: bool,
}

/// What one [`KernelPipeline::next_batch_blocking`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Turn {
    Batch(Batch),
    /// Nothing came within the timeout.
    Idle,
    /// A descriptor of the fast path's has what it waits for.
    Io,
    /// The stop descriptor became readable.
    Stopped,
}

/// Counters of the whole pipeline.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PipelineStats {
    pub pleg: PlegStats,
    /// Lifecycle events folded into a PodSync because the consumer lagged.
    pub stream_lagged: u64,
    /// Ring-buffer records that did not decode (counted, logged once, skipped).
    pub malformed: u64,
    /// Pods and containers the PLEG tracks now.
    pub pods: usize,
    pub containers: usize,
    /// Container inits registered in the kernel (their exit wakes the reader), and updates of
    /// that set that failed (the map full: such an init's exit comes within the poll period).
    pub known_inits: usize,
    pub known_init_failures: u64,
}

/// Probes, reader and PLEG, started.
pub struct KernelPipeline {
    probes: Arc<Mutex<Probes>>,
    reader: EventReader,
    pleg: Pleg,
    inits: KnownInits,
    init_sync: InitSync,
    lagged: pleg::LagCounter,
    /// The hook, and the events made and not yet queued: handed over at the end of each batch
    /// (and at the next turn when the consumer held the queue's lock then).
    out: Outbox,
}

impl KernelPipeline {
    /// Loads and attaches the probes, indexes the whole cgroup2 hierarchy, and walks the scan
    /// roots so that containers started before us are known with their init. Returns the
    /// pipeline and the PLEG stream it feeds.
    pub fn start(cfg: PipelineConfig) -> Result<(Self, PlegReceiver), PipelineError> {
        Self::start_with(cfg, BootClock::new(), None)
    }

    /// [`Self::start`] with the clock kernel times are mapped with (the agent makes it first and
    /// shares it), and a [`Hook`] on the loop's thread.
    pub fn start_with(
        cfg: PipelineConfig,
        clock: BootClock,
        hook: Option<HookFactory>,
    ) -> Result<(Self, PlegReceiver), PipelineError> {
        let mut probes = Probes::load(&cfg.probes)?;
        let reader = probes.events()?.with_clock(clock);
        let inits = probes.known_inits()?;
        let (tx, events) = pleg::channel(cfg.queue).map_err(KernelError::Io)?;
        let hook = hook.map(|make| make(&reader.clock()));
        let mut index = CgroupIndex::new(cfg.unified.clone(), cfg.roots);
        index.scan();
        let mut pleg = Pleg::new(index);
        // With hostPID the agent shares the node's pid namespace: its depth is the node's.
        pleg.set_host_ns_level(crate::kernel::own_pid_ns_level());
        let mut me = Self {
            probes: Arc::new(Mutex::new(probes)),
            reader,
            pleg,
            inits,
            init_sync: InitSync::default(),
            lagged: tx.lag_counter(),
            out: Outbox::new(tx, hook),
        };
        me.rescan();
        me.hand_over(true);
        me.sync_inits();
        // The walk's scratch (every directory listed, every process read) is garbage now.
        crate::mem::release_free_memory();
        Ok((me, events))
    }

    /// Waits for the kernel's next records, hands every one already in the ring buffer to the
    /// PLEG (each shown to `tap` first), and walks the cgroup tree again if records were lost.
    /// Cancel-safe: records not read yet stay in the ring buffer.
    pub async fn next_batch(
        &mut self,
        tap: impl FnMut(&KernelEvent),
    ) -> Result<Batch, KernelError> {
        let first = self.reader.next().await?;
        let batch = self.batch(first, tap);
        self.hand_over(true);
        Ok(batch)
    }

    /// [`Self::next_batch`] for a thread of its own: blocks for at most `timeout`, until `stop`
    /// is readable, or until one of `extra` has what it waits for ([`Turn::Io`]; its `revents`
    /// say what).
    pub(crate) fn next_batch_blocking(
        &mut self,
        timeout: Duration,
        stop: Option<BorrowedFd<'_>>,
        extra: &mut [libc::pollfd],
        tap: impl FnMut(&KernelEvent),
    ) -> Result<Turn, KernelError> {
        Ok(match self.reader.next_blocking(timeout, stop, extra)? {
            Wait::Event(first) => {
                let batch = self.batch(first, tap);
                self.hand_over(false);
                Turn::Batch(batch)
            }
            Wait::Idle => Turn::Idle,
            Wait::Io => Turn::Io,
            Wait::Stopped => Turn::Stopped,
        })
    }

    /// The loop's one turn after its first event: that one and every one already in the ring
    /// buffer through the PLEG, in ring order; the kernel's set of inits brought up to date; the
    /// cgroup tree walked again if records were lost.
    fn batch(&mut self, first: KernelEvent, mut tap: impl FnMut(&KernelEvent)) -> Batch {
        // Keeps the wall clock of every consumer in step with NTP.
        self.reader.refresh_clock();
        // A SCHED_FIFO reader holds itself to the reservation's bound, within a long batch too.
        crate::sched::police();
        let mut batch = Batch::default();
        let mut next = Some(first);
        while let Some(ev) = next {
            tap(&ev);
            self.pleg.handle(ev);
            self.deliver();
            batch.events += 1;
            if batch.events % 64 == 0 {
                crate::sched::police();
            }
            next = self.reader.try_next();
        }
        if self.pleg.needs_resync() {
            self.rescan();
            batch.resynced = true;
        }
        self.out.batch_end();
        self.sync_inits();
        batch
    }

    fn deliver(&mut self) {
        self.out.deliver(self.pleg.take_events());
    }

    /// Queues what [`Self::deliver`] kept. With `wait` false (the loop's own thread) the queue's
    /// lock is taken only if free; else the events wait for the next turn.
    fn hand_over(&mut self, wait: bool) -> bool {
        self.out.hand_over(wait)
    }

    fn sync_inits(&mut self) {
        self.init_sync
            .apply(&mut self.inits, self.pleg.take_init_changes());
    }

    fn rescan(&mut self) {
        if let Err(e) = self.pleg.rescan() {
            tracing::warn!("cgroup walk failed; pods appear at their next event: {e}");
        }
        self.deliver();
    }

    pub fn pleg(&self) -> &Pleg {
        &self.pleg
    }

    /// The clock kernel times are mapped with; refreshed at every batch, shared by its clones.
    pub fn clock(&self) -> BootClock {
        self.reader.clock()
    }

    pub fn stats(&self) -> PipelineStats {
        let (pods, containers) = self.pleg.model().counts();
        PipelineStats {
            pleg: self.pleg.stats(),
            stream_lagged: self.lagged.get(),
            malformed: self.reader.malformed(),
            pods,
            containers,
            known_inits: self.init_sync.len(),
            known_init_failures: self.init_sync.failures,
        }
    }

    /// The probes, shared: their kernel counters and per-program run time stay readable while
    /// the pipeline runs on its task.
    pub fn probes(&self) -> Arc<Mutex<Probes>> {
        Arc::clone(&self.probes)
    }

    /// The kernel's own counters (ring-buffer drops, ...). A failed read is an error, never 0.
    pub fn kernel_counters(&self) -> Result<KernelCounters, KernelError> {
        counters(&self.probes)
    }
}

fn counters(probes: &Mutex<Probes>) -> Result<KernelCounters, KernelError> {
    crate::sync::lock(probes).counters()
}
