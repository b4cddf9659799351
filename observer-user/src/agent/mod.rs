//! The agent, built as one chain in one place ([`Agent::build`]), for every consumer (`observer
//! run`, `observer status`, `watch --pods`, the tests): what the chain shares first (the state
//! store, the boot clock), then the reconciler (the truth) and the writers that read
//! it (the status manager; the fast path's hook), then the kernel pipeline that feeds them
//! (probes → reader → PLEG, the hook on its thread), then the kernel log, and last every task
//! started and supervised ([`tasks`]): one that ends fails the agent. Generic over the runtime
//! (the CRI in the binary, a stand-in in the tests). [`run`] adds what `observer run` has around
//! it: the metrics ([`metrics`]) and the HTTP endpoint ([`http`]).
pub mod access;
pub mod http;
pub mod metrics;
mod run;
pub mod tasks;

use std::{ffi::OsString, path::PathBuf, sync::Arc, time::Duration};

use tokio::sync::mpsc;

pub use run::run;
pub use run::RunConfig;
pub use run::StatusSetup;
use tasks::Tasks;

use crate::{
    cgroup::CgroupMounts,
    cri::{CriConfig, CriEndpoint, ReconnectingCri},
    fastpath::{FastConfig, FastPath, FastStats},
    kernel::{
        kmsg::{self, LogStats},
        KernelCounters, KernelError,
    },
    model::{BootClock, Clock, SharedClock, SystemClock},
    pipeline::{
        HookFactory, KernelPipeline, PipelineConfig, PipelineHealth, PipelineTask, ReaderThread,
    },
    reconcile::{
        inits::InitStore, OomHistory, ReconcileConfig, ReconcileHandle, Reconciler, RuntimeService,
    },
    status::{AliveLedger, StatusConfig, StatusHandle, StatusManager, StatusMode},
    sync::AbortOnDrop,
    Error,
};

/// Where the runtime is and how the reader runs, as the command line says it.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    pub cri: CriEndpoint,
    /// Where the host's cgroup filesystems are mounted when the agent runs in a container.
    pub cgroupfs: Option<PathBuf>,
    /// kubelet's `--cgroup-root`s or kubepods cgroups (`--cgroup-root`); empty: found
    /// ([`crate::cgroup::KubeRoots::detect`]).
    pub cgroup_roots: Vec<String>,
    pub reconcile: ReconcileConfig,
    /// Where the kernel reader and the PLEG run (`--realtime-priority` makes it real-time).
    pub reader: ReaderThread,
}

impl AgentConfig {
    pub fn new(cri: CriEndpoint) -> Self {
        Self {
            cri,
            cgroupfs: None,
            cgroup_roots: Vec::new(),
            reconcile: ReconcileConfig::default(),
            reader: ReaderThread::default(),
        }
    }
}

/// Everything the chain is built from: the binary makes them from its configuration
/// ([`AgentParts::for_node`]), the tests from stand-ins.
pub struct AgentParts<R: RuntimeService = ReconnectingCri, C: Clock = SystemClock> {
    pub runtime: R,
    /// The wall clock every part decides by (transition times, the manager's epoch, a kill's
    /// grace); the kernel's own times are mapped by the pipeline's boot clock.
    pub clock: C,
    /// What the runtime is called where it does not say (the socket's path tells).
    pub runtime_fallback: String,
    pub pipeline: PipelineConfig,
    pub reader: ReaderThread,
    pub reconcile: ReconcileConfig,
    /// The host's cgroup mounts, where each OOM-ing cgroup's limit is read at the kill.
    pub mounts: Option<CgroupMounts>,
    /// A hook of the caller's on the reader's thread (`watch --pods` prints there); ignored
    /// when the writers have a fast path, which is then the hook.
    pub hook: Option<HookFactory>,
    /// What writes to the API; `None` for the one-shot readers.
    pub writers: Option<Writers>,
}

/// The status manager, and in `conditions` mode the fast path.
pub struct Writers {
    pub client: ::kube::Client,
    pub status: StatusConfig,
    pub fast: Option<FastSetup>,
}

/// Where the fast path opens its own connections.
pub struct FastSetup {
    /// `--kubeconfig` (else in-cluster): its connections are opened from it.
    pub kubeconfig: Option<OsString>,
}

impl AgentParts<ReconnectingCri> {
    /// The parts for this node: the CRI at `cfg.cri`, kubelet's pods in the host's cgroup2
    /// hierarchy, no writers.
    pub(crate) fn for_node(cfg: AgentConfig) -> Result<Self, Error> {
        Ok(Self {
            runtime: ReconnectingCri::new(CriConfig::new(cfg.cri.clone())),
            clock: SystemClock,
            runtime_fallback: fallback_name(&cfg.cri),
            pipeline: PipelineConfig::kubepods(cfg.cgroupfs.as_deref(), &cfg.cgroup_roots)?,
            reader: cfg.reader,
            reconcile: cfg.reconcile,
            mounts: CgroupMounts::detect(cfg.cgroupfs.as_deref()).ok(),
            hook: None,
            writers: None,
        })
    }
}

/// What the socket's path says the runtime is, for kubelet's `<runtime>://` container ids.
fn fallback_name(endpoint: &CriEndpoint) -> String {
    if endpoint.path().to_string_lossy().contains("crio") {
        "cri-o".into()
    } else {
        "containerd".into()
    }
}

/// A running agent. Dropping it stops everything.
pub struct Agent<R: RuntimeService = ReconnectingCri> {
    // Dropped first (fields drop in order): the tasks are stopped before the kernel reader, so
    // that its stream ending under them is a normal end, not a failure.
    tasks: Tasks,
    /// The kernel log's reader: it may end (the log unreadable) and the agent goes on without.
    _kmsg: AbortOnDrop,
    /// What the kernel log's readers did not believe.
    kernel_log: Arc<LogStats>,
    pub reconcile: ReconcileHandle,
    pub runtime: R,
    /// The status manager's handle, with writers.
    pub status: Option<StatusHandle>,
    /// The fast path's counters, with one.
    pub fast: Option<Arc<FastStats>>,
    /// The PodReports' counters, with writers (any mode but off).
    pub reports: Option<Arc<crate::present::report::ReportStats>>,
    runtime_fallback: String,
    kernel: PipelineTask,
}

impl Agent<ReconnectingCri> {
    /// The one-shot readers' agent: [`Self::build`] of [`AgentParts::for_node`].
    pub async fn start(cfg: AgentConfig) -> Result<Self, Error> {
        Self::build(AgentParts::for_node(cfg)?).await
    }
}

impl<R: RuntimeService> Agent<R> {
    /// The chain, top to bottom: a kernel record becomes a lifecycle event on the reader's
    /// thread (the fast path's hook sees it there and may write the death's PATCH at once),
    /// then the reconciler's view, then the status manager's PATCH.
    pub async fn build<C: Clock>(parts: AgentParts<R, C>) -> Result<Self, Error> {
        let AgentParts {
            runtime,
            clock: wall,
            runtime_fallback,
            pipeline,
            reader,
            reconcile,
            mounts,
            hook,
            writers,
        } = parts;
        // What the chain shares. The state directory first: a second agent on it is refused
        // before anything is loaded.
        let inits = match &reconcile.state_dir {
            Some(dir) => InitStore::open(dir, reconcile.state_access)?,
            None => InitStore::in_memory(),
        };
        let clock = BootClock::new();
        let wall: SharedClock = Arc::new(wall);
        // kubelet's roots, as the pipeline found them: the kernel log's cgroups name a
        // container only below them too.
        let roots = pipeline.roots.clone();
        let kernel_log = Arc::new(LogStats::default());
        let mut tasks = Tasks::default();

        // The truth: the reconciler (its history of the kernel log comes once the probes are in).
        let (mut reconciler, handle) = Reconciler::new(
            runtime.clone(),
            reconcile,
            clock.clone(),
            OomHistory::new(roots.clone()),
            inits,
        );
        reconciler.set_wall_clock(Arc::clone(&wall));
        // Limit hits are judged where the memory controller's cgroups are readable.
        reconciler.set_memory_reader(mounts.as_ref().and_then(crate::pressure::MemoryReader::new));

        // The writers: the status manager, and the fast path's hook with its connections.
        let mut status = None;
        let mut fast = None;
        let mut reports = None;
        let mut hook = hook;
        if let Some(w) = writers {
            let mode = w.status.mode;
            let types = w.status.condition_types();
            let (field_manager, request_timeout) =
                (w.status.reporter.clone(), w.status.request_timeout);
            let node_name = w.status.node_name.clone();
            let report_client = w.client.clone();
            let (manager, h) = StatusManager::new(w.client, w.status, handle.clone());
            // What people read of each pod's deaths: PodReports, in every mode that reaches the
            // API (present/report.rs), from the same view and the same reflector.
            if mode != StatusMode::Off {
                let writer = crate::present::report::ReportWriter::new(
                    report_client,
                    handle.clone(),
                    h.pods().clone(),
                    &node_name,
                    &field_manager,
                );
                reports = Some(writer.stats());
                tasks.spawn("PodReports writer", writer.run());
            }
            let mut manager = manager.with_clock(Arc::clone(&wall));
            if let Some(setup) = w.fast.filter(|_| mode == StatusMode::Conditions) {
                // The ledger's signal wakes the manager when a fast write is answered.
                let ledger = Arc::new(AliveLedger::new().map_err(KernelError::Io)?);
                manager.set_alive_ledger(Arc::clone(&ledger));
                // Connections are opened at normal priority and handed to the reader's thread.
                let path = FastPath::build(FastConfig {
                    kubeconfig: setup.kubeconfig,
                    field_manager,
                    request_timeout,
                    types,
                    ledger,
                    clock: Arc::clone(&wall),
                })
                .map_err(KernelError::Io)?;
                tasks.spawn("fast path's dialer", path.dialer.run());
                hook = Some(path.hook);
                fast = Some(path.stats);
            }
            if let Some(worker) = manager.take_events_worker() {
                tasks.spawn("Events worker", worker);
            }
            // Only the full status names the runtime (container ids are `<runtime>://<id>`):
            // only then is its answer waited for, which holds the API's first list back.
            let wait = match mode {
                StatusMode::Full => Duration::from_secs(10),
                _ => Duration::ZERO,
            };
            let (named, fallback) = (runtime.clone(), runtime_fallback.clone());
            tasks.spawn("status manager", async move {
                let name = named.name(wait).await.unwrap_or(fallback);
                manager.with_runtime_name(name).run().await
            });
            status = Some(h);
        }

        // The kernel: probes → reader → PLEG, the hook on the reader's thread.
        let (kernel, events) = KernelPipeline::start_with(pipeline, clock, hook)?;
        // The follower first, then the history, both after the probes are attached: every kill
        // is seen by the probes, or in the log, or both (a kill in both logs counts once).
        let follower = kmsg::Follower::open(Arc::clone(&kernel_log));
        reconciler.set_history(OomHistory::read(roots, &kernel_log));
        let (tx, rx) = mpsc::channel(256);
        reconciler.follow_kernel_log(rx);
        let kmsg_task = AbortOnDrop(match follower {
            Ok(f) => tokio::spawn(follow_kernel_log(f, mounts, tx)),
            Err(e) => {
                // In a container that is not privileged /dev/kmsg cannot be opened; the same log
                // is read through syslog(2) once each kill the probes report has been logged.
                tracing::info!("/dev/kmsg not followed ({e}): the kernel log is read through syslog(2) at each OOM kill");
                tokio::spawn(reread_kernel_log(
                    handle.pleg_events(),
                    mounts,
                    tx,
                    Arc::clone(&kernel_log),
                ))
            }
        });
        let relist = handle.clone();
        let kernel = kernel.spawn(reader, move || relist.request_relist())?;
        tasks.spawn("reconciler", reconciler.run(events));
        Ok(Self {
            tasks,
            _kmsg: kmsg_task,
            kernel_log,
            reconcile: handle,
            runtime,
            status,
            fast,
            reports,
            runtime_fallback,
            kernel,
        })
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

    /// What the kernel log's readers did not believe.
    pub fn kernel_log(&self) -> Arc<LogStats> {
        Arc::clone(&self.kernel_log)
    }

    /// What `/metrics` reads of this agent (the runtime connection's own metrics are the
    /// caller's to add: the runtime is generic here).
    pub fn metric_sources(&self) -> crate::agent::metrics::Sources {
        crate::agent::metrics::Sources {
            pipeline: self.pipeline(),
            probes: self.probes(),
            reconcile: self.reconcile.clone(),
            cri: None,
            status: self.status.clone(),
            fast: self.fast.clone(),
            reports: self.reports.clone(),
            kernel_log: self.kernel_log(),
            access: None,
        }
    }

    pub fn clock(&self) -> BootClock {
        self.kernel.clock()
    }

    /// What `/healthz` reads of the tasks.
    pub(crate) fn task_health(&self) -> tasks::TaskHealth {
        self.tasks.health()
    }

    /// Runs `task` under the agent's supervision (its end fails the agent).
    pub fn spawn(
        &mut self,
        name: &'static str,
        task: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        self.tasks.spawn(name, task);
    }

    /// Waits until the runtime answers (or `timeout`).
    pub async fn wait_runtime(&self, timeout: Duration) -> bool {
        self.runtime.wait_connected(timeout).await
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
        match self.runtime.name(wait).await {
            Some(name) => name,
            None => self.runtime_fallback.clone(),
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
    stats: Arc<LogStats>,
) {
    use tokio::sync::broadcast::error::RecvError;
    let mut seen_up_to = 0u64;
    // What is not believed is counted once: the start-up read counted the log up to now, each
    // re-read counts what came after the one before.
    let mut counted_up_to = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .ok()
        .map(|t| t.tv_sec() as u64 * 1_000_000 + t.tv_nsec() as u64 / 1000);
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
        let after = counted_up_to;
        let history = match tokio::task::spawn_blocking(move || kmsg::read_history_from(after))
            .await
        {
            Ok(Ok((h, _))) => {
                stats.add(&h.ignored);
                counted_up_to = h.until_us.or(counted_up_to);
                h
            }
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
