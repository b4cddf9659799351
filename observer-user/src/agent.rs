//! The agent's pipeline, wired once for every consumer (`observer status`, the tests, later the
//! status manager): kernel probes → PLEG (with the start-up walk) → reconciler against the CRI.
use std::{path::PathBuf, time::Duration};

use tokio::task::JoinHandle;

use crate::{
    cgroup::{
        cgroup_id, find_kubepods_roots, CgroupError, CgroupIndex, CgroupMounts, HierarchyMount,
    },
    cri::{CriConfig, CriEndpoint, ReconnectingCri},
    kernel::{EventReader, KernelError, ProbeOptions, Probes, Watch, WatchRoot},
    pleg::{self, Pleg, PlegReceiver, PlegStats},
    reconcile::{ReconcileConfig, ReconcileHandle, Reconciler},
};

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    #[error("no cgroup2 hierarchy is mounted: observer attributes events by cgroup2 ids")]
    NoCgroup2,
}

#[derive(Clone, Debug)]
pub struct AgentConfig {
    pub cri: CriEndpoint,
    /// Subtrees (relative to the cgroup2 root) holding the pods; empty: kubelet's kubepods roots.
    pub cgroup_roots: Vec<String>,
    pub cgroupfs: Option<PathBuf>,
    pub reconcile: ReconcileConfig,
}

impl AgentConfig {
    pub fn new(cri: CriEndpoint) -> Self {
        Self {
            cri,
            cgroup_roots: Vec::new(),
            cgroupfs: None,
            reconcile: ReconcileConfig::default(),
        }
    }
}

/// A running pipeline. Dropping it stops everything.
pub struct Agent {
    pub reconcile: ReconcileHandle,
    pub cri: ReconnectingCri,
    kernel: JoinHandle<PlegStats>,
    reconciler: JoinHandle<()>,
    /// Kept for their lifetime (dropping them detaches the programs) and their counters; the
    /// mutex makes the agent shareable across tasks.
    probes: std::sync::Mutex<Probes>,
}

impl Agent {
    /// Loads the probes, walks the pod cgroups once, and starts the PLEG and reconciler tasks.
    pub async fn start(cfg: AgentConfig) -> Result<Self, AgentError> {
        let mounts = CgroupMounts::detect(cfg.cgroupfs.as_deref())?;
        let unified = mounts.unified().cloned().ok_or(AgentError::NoCgroup2)?;
        let roots = if cfg.cgroup_roots.is_empty() {
            find_kubepods_roots(&unified)
        } else {
            cfg.cgroup_roots.clone()
        };
        // No kubepods root yet (no pod ever ran here): everything is watched, which stays correct
        // when kubelet makes it, only busier.
        let present = watch_roots(&unified, &roots)?;
        let watch = if present.is_empty() {
            Watch::All
        } else {
            Watch::Roots(present)
        };
        let KernelPipeline {
            probes,
            reader,
            pleg,
            events,
        } = KernelPipeline::start(
            &unified,
            &roots,
            ProbeOptions {
                watch,
                ..Default::default()
            },
        )?;

        let cri = ReconnectingCri::new(CriConfig::new(cfg.cri.clone()));
        let (reconciler, handle) = Reconciler::new(cri.clone(), cfg.reconcile.clone());
        let reconciler = tokio::spawn(reconciler.run(events));
        let kernel = tokio::spawn(kernel_loop(reader, pleg, roots, handle.clone()));
        Ok(Self {
            reconcile: handle,
            cri,
            kernel,
            reconciler,
            probes: std::sync::Mutex::new(probes),
        })
    }

    /// Records the kernel dropped so far.
    pub fn kernel_drops(&self) -> u64 {
        self.probes
            .lock()
            .ok()
            .and_then(|p| p.counters().ok())
            .map_or(0, |c| c.ringbuf_drops)
    }

    /// Waits until the runtime answers (or `timeout`).
    pub async fn wait_runtime(&self, timeout: Duration) -> bool {
        self.cri.wait_connected(timeout).await.is_ok()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kernel.abort();
        self.reconciler.abort();
    }
}

/// The kernel half of the pipeline: probes loaded and attached, and a PLEG that knows every
/// cgroup (one walk of the whole hierarchy for paths, one of `roots` for pods and containers).
pub struct KernelPipeline {
    pub probes: Probes,
    pub reader: EventReader,
    pub pleg: Pleg,
    pub events: PlegReceiver,
}

impl KernelPipeline {
    pub fn start<S: AsRef<str>>(
        unified: &HierarchyMount,
        roots: &[S],
        opts: ProbeOptions,
    ) -> Result<Self, AgentError> {
        let mut probes = Probes::load(&opts)?;
        let reader = probes.events()?;
        let (tx, events) = pleg::channel(64 * 1024);
        let mut index = CgroupIndex::new(unified.clone());
        index.scan();
        let mut pleg = Pleg::new(index, tx);
        if let Err(e) = pleg.rescan(roots) {
            tracing::warn!("cgroup walk failed; pods appear at their next event: {e}");
        }
        Ok(Self {
            probes,
            reader,
            pleg,
            events,
        })
    }
}

/// The `WatchRoot`s (cgroup id and depth) of those of `roots` that exist, relative to the cgroup2
/// root, for the kernel's filter.
pub fn watch_roots<S: AsRef<str>>(
    unified: &HierarchyMount,
    roots: &[S],
) -> Result<Vec<WatchRoot>, CgroupError> {
    let mut out = Vec::new();
    for rel in roots.iter().map(AsRef::as_ref) {
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

fn rescan(pleg: &mut Pleg, roots: &[String]) {
    if let Err(e) = pleg.rescan(roots) {
        tracing::warn!("cgroup walk failed; pods appear at their next event: {e}");
    }
}

async fn kernel_loop(
    mut reader: EventReader,
    mut pleg: Pleg,
    roots: Vec<String>,
    reconcile: ReconcileHandle,
) -> PlegStats {
    loop {
        match reader.next().await {
            Ok(ev) => {
                pleg.handle(ev);
                while let Some(ev) = reader.try_next() {
                    pleg.handle(ev);
                }
                if pleg.needs_resync() {
                    rescan(&mut pleg, &roots);
                    reconcile.request_relist();
                }
            }
            Err(e) => {
                tracing::error!("kernel event stream failed: {e}");
                return pleg.stats();
            }
        }
    }
}
