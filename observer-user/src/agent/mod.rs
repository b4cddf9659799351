//! The agent, wired once for every consumer (`observer run`, `observer status`, `watch --pods`,
//! the tests): the kernel pipeline (probes → PLEG, on its own thread) → the reconciler against the
//! CRI, with the kernel log followed. [`run`] adds what `observer run` has: the status manager
//! (reading the reconciler's changes), its Events worker, and the HTTP endpoint ([`http`],
//! [`metrics`]). Every task is supervised ([`tasks`]): one that ends fails the agent.
pub mod http;
pub mod metrics;
mod run;
pub mod tasks;

use std::{path::PathBuf, sync::Arc, time::Duration};

use tokio::sync::mpsc;

pub use run::{run, RunConfig, StatusSetup};
use tasks::Tasks;

use crate::{
    cgroup::CgroupMounts,
    cri::{CriConfig, CriEndpoint, ReconnectingCri},
    kernel::{kmsg, BootClock, KernelCounters, KernelError},
    pipeline::{KernelPipeline, PipelineConfig, PipelineHealth, PipelineTask, ReaderThread},
    reconcile::{inits::InitStore, OomHistory, ReconcileConfig, ReconcileHandle, Reconciler},
    sync::AbortOnDrop,
    Error,
};

#[derive(Clone, Debug)]
pub struct AgentConfig {
    pub cri: CriEndpoint,
    /// Where the host's cgroup filesystems are mounted when the agent runs in a container.
    pub cgroupfs: Option<PathBuf>,
    pub reconcile: ReconcileConfig,
    /// Where the kernel reader and the PLEG run (`--realtime-priority` makes it real-time).
    pub reader: ReaderThread,
}

impl AgentConfig {
    pub fn new(cri: CriEndpoint) -> Self {
        Self {
            cri,
            cgroupfs: None,
            reconcile: ReconcileConfig::default(),
            reader: ReaderThread::default(),
        }
    }
}

/// A running agent. Dropping it stops everything.
pub struct Agent {
    pub reconcile: ReconcileHandle,
    pub cri: ReconnectingCri,
    endpoint: CriEndpoint,
    kernel: PipelineTask,
    /// The reconciler, and what [`run`] adds.
    tasks: Tasks,
    /// The kernel log's reader: it may end (the log unreadable) and the agent goes on without.
    _kmsg: AbortOnDrop,
    tap: Option<tokio::sync::broadcast::Receiver<crate::pleg::PodLifecycleEvent>>,
}

impl Agent {
    /// Loads the probes, walks the pod cgroups once, reads the kernel log's OOM kills, and starts
    /// the pipeline and reconciler tasks.
    pub async fn start(cfg: AgentConfig) -> Result<Self, Error> {
        Self::start_with(cfg, None).await
    }

    /// [`Self::start`] with a fast path on the kernel loop's thread (see [`crate::pleg::FastPath`]).
    pub async fn start_with(
        cfg: AgentConfig,
        fast: Option<crate::pipeline::FastPathFactory>,
    ) -> Result<Self, Error> {
        // First: a second agent on this state directory is refused before it loads anything.
        let inits = match &cfg.reconcile.state_dir {
            Some(dir) => InitStore::open(dir, cfg.reconcile.state_access)?,
            None => InitStore::in_memory(),
        };
        let (pipeline, events) =
            KernelPipeline::start_with(PipelineConfig::kubepods(cfg.cgroupfs.as_deref())?, fast)?;
        // The follower first, then the history, both after the probes are attached: every kill
        // is seen by the probes, or in the log, or both (a kill in both logs counts once).
        let follower = kmsg::Follower::open();
        let history = OomHistory::read();
        let cri = ReconnectingCri::new(CriConfig::new(cfg.cri.clone()));
        let (mut reconciler, handle) = Reconciler::new(
            cri.clone(),
            cfg.reconcile.clone(),
            pipeline.clock(),
            history,
            inits,
        );
        let (tx, rx) = mpsc::channel(256);
        reconciler.follow_kernel_log(rx);
        let mounts = CgroupMounts::detect(cfg.cgroupfs.as_deref()).ok();
        let kmsg_task = AbortOnDrop(match follower {
            Ok(f) => tokio::spawn(follow_kernel_log(f, mounts, tx)),
            Err(e) => {
                // In a container that is not privileged /dev/kmsg cannot be opened; the same log
                // is read through syslog(2) once each kill the probes report has been logged.
                tracing::info!("/dev/kmsg not followed ({e}): the kernel log is read through syslog(2) at each OOM kill");
                tokio::spawn(reread_kernel_log(handle.pleg_events(), mounts, tx))
            }
        });
        // Subscribed before the reconciler runs, so the start-up walk's events are in it.
        let tap = handle.pleg_events();
        let relist = handle.clone();
        let kernel = pipeline.spawn(cfg.reader, move || relist.request_relist())?;
        let mut tasks = Tasks::default();
        tasks.spawn("reconciler", reconciler.run(events));
        Ok(Self {
            reconcile: handle,
            cri,
            endpoint: cfg.cri,
            kernel,
            tasks,
            _kmsg: kmsg_task,
            tap: Some(tap),
        })
    }

    /// The PLEG events the reconciler consumes, from the very first (the start-up walk's); later
    /// calls subscribe from now on.
    pub fn take_pleg_events(
        &mut self,
    ) -> tokio::sync::broadcast::Receiver<crate::pleg::PodLifecycleEvent> {
        self.tap
            .take()
            .unwrap_or_else(|| self.reconcile.pleg_events())
    }

    /// The kernel's own counters (ring-buffer drops, ...). A failed read is an error, never 0.
    pub fn kernel_counters(&self) -> Result<KernelCounters, KernelError> {
        self.kernel.kernel_counters()
    }

    /// The kernel pipeline's heartbeat and stats.
    pub fn pipeline(&self) -> Arc<PipelineHealth> {
        self.kernel.health()
    }

    /// The probes: their counters and per-program run time.
    pub fn probes(&self) -> Arc<std::sync::Mutex<crate::kernel::Probes>> {
        self.kernel.probes()
    }

    pub fn clock(&self) -> BootClock {
        self.kernel.clock()
    }

    /// Waits until the runtime answers (or `timeout`).
    pub async fn wait_runtime(&self, timeout: Duration) -> bool {
        self.cri.wait_connected(timeout).await.is_ok()
    }

    /// Resolves when a part of the agent stopped (the kernel reader failed, a task ended): the
    /// agent's answers would go stale from then on.
    pub async fn failed(&mut self) -> Error {
        tokio::select! {
            e = self.kernel.stopped() => Error::Pipeline(e),
            why = self.tasks.failed() => Error::Stopped(why),
        }
    }

    /// The scheme kubelet puts before container ids in the API (`containerd://`, `cri-o://`): the
    /// runtime's own name (waiting up to `wait` for it), else what the socket's path says.
    pub async fn runtime_name(&self, wait: Duration) -> String {
        if let Ok(client) = self.cri.wait_connected(wait).await {
            if let Ok(v) = client.version().await {
                return v.runtime_name;
            }
        }
        if self.endpoint.path().to_string_lossy().contains("crio") {
            "cri-o".into()
        } else {
            "containerd".into()
        }
    }
}

/// After each OOM kill the probes report, the log's lines of it (the cgroup whose limit was hit,
/// its limit, the memory figures older kernels' tracepoint lacks), read through syslog(2). The
/// kernel logs a kill before the victim exits, which is when the probes report it.
async fn reread_kernel_log(
    mut pleg: tokio::sync::broadcast::Receiver<crate::pleg::PodLifecycleEvent>,
    mounts: Option<CgroupMounts>,
    tx: mpsc::Sender<kmsg::LoggedOomKill>,
) {
    use tokio::sync::broadcast::error::RecvError;
    let mut seen_up_to = 0u64;
    loop {
        match pleg.recv().await {
            Ok(ev) if ev.oom().is_none() => continue,
            Ok(_) | Err(RecvError::Lagged(_)) => {}
            Err(RecvError::Closed) => return,
        }
        // A group kill's members follow in the same burst: one read for all of them.
        while let Ok(Ok(_)) =
            tokio::time::timeout(std::time::Duration::from_millis(20), pleg.recv()).await
        {}
        let history = match tokio::task::spawn_blocking(kmsg::read_history).await {
            Ok(Ok(h)) => h,
            Ok(Err(e)) => {
                tracing::warn!("the kernel log cannot be read ({e}): OOM kills show without the cgroup whose limit was hit");
                return;
            }
            Err(_) => return,
        };
        let after = seen_up_to;
        for mut kill in history.kills.into_iter().filter(|k| k.at_us > after) {
            seen_up_to = seen_up_to.max(kill.at_us);
            // The report's own figure (the limit at the kill) wins over one read now.
            kill.limit_bytes = kill.limit_bytes.or_else(|| {
                mounts
                    .as_ref()
                    .and_then(|m| m.memory_limit(&kill.oom_memcg))
            });
            if tx.send(kill).await.is_err() {
                return;
            }
        }
    }
}

/// Reads each new kill from the kernel log, with the OOM-ing cgroup's limit read at once (it can
/// change, and the cgroup can go, soon after).
async fn follow_kernel_log(
    mut log: kmsg::Follower,
    mounts: Option<CgroupMounts>,
    tx: mpsc::Sender<kmsg::LoggedOomKill>,
) {
    loop {
        match log.next().await {
            Ok(mut kill) => {
                kill.limit_bytes = kill.limit_bytes.or_else(|| {
                    mounts
                        .as_ref()
                        .and_then(|m| m.memory_limit(&kill.oom_memcg))
                });
                if tx.send(kill).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                tracing::warn!("kernel log follower stopped ({e}): OOM kills show without the cgroup whose limit was hit");
                return;
            }
        }
    }
}
