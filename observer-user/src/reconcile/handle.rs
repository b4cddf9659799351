//! The reconciler's outside: read the view, wait for changes or for the first full picture, ask
//! for a relist, tap the PLEG events it consumed.
use std::{
    collections::{HashMap, HashSet},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, RwLock, RwLockReadGuard, RwLockWriteGuard,
    },
    time::Duration,
};

use tokio::sync::{broadcast, watch, Notify};

use super::view::PodView;
use crate::{model::PodUid, pleg::PodLifecycleEvent};

/// How often the reconciler's loop turns at the least.
pub(super) const HEARTBEAT: Duration = Duration::from_secs(5);

/// The node as reconciled, by pod uid.
pub(crate) type NodeView = HashMap<PodUid, PodView>;

/// Counters, readable while the reconciler runs.
#[derive(Debug, Default)]
pub struct ReconcileStats {
    pub pleg_events: AtomicU64,
    pub pod_fetches: AtomicU64,
    pub fetch_errors: AtomicU64,
    pub relists: AtomicU64,
    /// Differences a relist had to repair: events the event-driven path missed.
    pub missed_events: AtomicU64,
    /// Pods the runtime knew and the kernel never reported (not at start).
    pub adopted: AtomicU64,
    /// Containers the kernel reported that the runtime never came to know.
    pub unknown_dropped: AtomicU64,
    /// Containers where the agent's account replaced the runtime's (reason or exit code).
    pub corrected: AtomicU64,
    /// Ids from the runtime that are not of the shape kubelet and the runtimes use (skipped).
    pub unparsable: AtomicU64,
    /// The runtime's init pid compared with the kernel's, and how often they disagreed.
    pub init_checks: AtomicU64,
    pub init_disagreements: AtomicU64,
    /// Limit hits read (`pressure`), those whose memory cgroup was none of the container's and
    /// its parents' (a write to a limit from outside), and those whose cgroup could not be read.
    pub limit_hits_read: AtomicU64,
    pub limit_hits_elsewhere: AtomicU64,
    pub limit_hit_read_errors: AtomicU64,
}

impl ReconcileStats {
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}

pub(super) fn bump(c: &AtomicU64) {
    add(c, 1);
}

pub(super) fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// What the reconciler shares with its handles.
pub(super) struct Shared {
    pub view: RwLock<NodeView>,
    pub stats: ReconcileStats,
    pub relist: Notify,
    pub generation: watch::Sender<u64>,
    /// True once the first relist ran and every pod request it started was answered.
    pub settled: watch::Sender<bool>,
    pub pleg: broadcast::Sender<PodLifecycleEvent>,
    /// When the loop last turned (for health checks).
    born: std::time::Instant,
    last_turn_ms: AtomicU64,
    /// Pods whose view changed since the consumer last took them, and since when.
    dirty: std::sync::Mutex<HashMap<PodUid, tokio::time::Instant>>,
    dirty_notify: Notify,
    /// The same for the pod reports' writer, a consumer of its own (`present::report`).
    reports_dirty: std::sync::Mutex<HashSet<PodUid>>,
    reports_notify: Notify,
    /// From a container init's exit in the kernel to the reconciler's view of it.
    pub detection_latency: crate::exposition::Latency,
    /// The OOM kills of each container ([`super::kills`]).
    pub oom_kills: prometheus_client::metrics::family::Family<
        super::OomKillLabels,
        prometheus_client::metrics::counter::Counter,
    >,
    /// Limit hits and memory warnings ([`crate::pressure`]).
    pub pressure: crate::pressure::metrics::PressureMetrics,
}

impl Shared {
    pub(super) fn new() -> Self {
        Self {
            view: RwLock::default(),
            stats: ReconcileStats::default(),
            relist: Notify::new(),
            generation: watch::Sender::new(0),
            settled: watch::Sender::new(false),
            pleg: broadcast::Sender::new(4096),
            born: std::time::Instant::now(),
            last_turn_ms: AtomicU64::new(0),
            dirty: Default::default(),
            dirty_notify: Notify::new(),
            reports_dirty: Default::default(),
            reports_notify: Notify::new(),
            detection_latency: Default::default(),
            oom_kills: Default::default(),
            pressure: Default::default(),
        }
    }

    pub(crate) fn beat(&self) {
        self.last_turn_ms
            .store(self.born.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    pub(super) fn view(&self) -> RwLockReadGuard<'_, NodeView> {
        crate::sync::read(&self.view)
    }

    pub(crate) fn view_mut(&self) -> RwLockWriteGuard<'_, NodeView> {
        crate::sync::write(&self.view)
    }

    /// The view of `uid` changed (or the pod left it).
    pub(super) fn changed(&self, uid: PodUid) {
        crate::sync::lock(&self.dirty)
            .entry(uid)
            .or_insert_with(tokio::time::Instant::now);
        self.dirty_notify.notify_one();
        crate::sync::lock(&self.reports_dirty).insert(uid);
        self.reports_notify.notify_one();
        self.generation.send_modify(|g| *g += 1);
    }
}

/// Cheap to clone.
#[derive(Clone)]
pub struct ReconcileHandle(pub(super) Arc<Shared>);

impl ReconcileHandle {
    /// Every pod, sorted by namespace and name.
    pub fn pods(&self) -> Vec<PodView> {
        let mut pods: Vec<PodView> = self.0.view().values().cloned().collect();
        pods.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        pods
    }

    pub fn pod(&self, uid: &PodUid) -> Option<PodView> {
        self.0.view().get(uid).cloned()
    }

    /// The containers whose memory the warnings judged, each with its pod's uid.
    pub(crate) fn pressured(&self) -> Vec<(PodUid, super::ContainerView)> {
        let view = self.0.view();
        view.values()
            .flat_map(|p| {
                p.containers
                    .iter()
                    .filter(|c| c.memory.is_some())
                    .map(move |c| (p.uid, c.clone()))
            })
            .collect()
    }

    pub fn stats(&self) -> &ReconcileStats {
        &self.0.stats
    }

    /// Bumped on every change of the view.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.0.generation.subscribe()
    }

    /// The PLEG events the reconciler consumed, as they arrive.
    pub fn pleg_events(&self) -> broadcast::Receiver<PodLifecycleEvent> {
        self.0.pleg.subscribe()
    }

    /// Whether the first relist ran and the pod requests it started were answered: the view then
    /// holds every pod the runtime has.
    pub(crate) fn is_settled(&self) -> bool {
        *self.0.settled.borrow()
    }

    /// Waits until [`Self::is_settled`], up to `timeout`.
    pub async fn settled(&self, timeout: Duration) -> bool {
        let mut rx = self.0.settled.subscribe();
        let settled = tokio::time::timeout(timeout, rx.wait_for(|s| *s)).await;
        matches!(settled, Ok(Ok(_)))
    }

    pub fn request_relist(&self) {
        self.0.relist.notify_one();
    }

    /// Time since the reconciler's loop last turned (it turns at least every few seconds).
    pub(crate) fn since_last_turn(&self) -> Duration {
        self.0.born.elapsed().saturating_sub(Duration::from_millis(
            self.0.last_turn_ms.load(Ordering::Relaxed),
        ))
    }

    /// The pods whose view changed since the last call, each with when it first changed, waiting
    /// until there is one. Meant for one consumer (the status manager): a burst of changes to a
    /// pod is one entry.
    pub(crate) async fn changed_pods(&self) -> Vec<(PodUid, tokio::time::Instant)> {
        loop {
            let notified = self.0.dirty_notify.notified();
            let taken = self.take_changed();
            if !taken.is_empty() {
                return taken;
            }
            notified.await;
        }
    }

    /// The pods whose view changed since the last call, for the pod reports' writer: a queue of
    /// its own beside [`Self::changed_pods`], waiting until there is one.
    pub(crate) async fn changed_for_reports(&self) -> Vec<PodUid> {
        loop {
            let notified = self.0.reports_notify.notified();
            let taken: Vec<PodUid> = crate::sync::lock(&self.0.reports_dirty).drain().collect();
            if !taken.is_empty() {
                return taken;
            }
            notified.await;
        }
    }

    /// What [`Self::changed_pods`] would return now, without waiting.
    pub(crate) fn take_changed(&self) -> Vec<(PodUid, tokio::time::Instant)> {
        crate::sync::lock(&self.0.dirty).drain().collect()
    }

    /// Changes not taken yet.
    pub(crate) fn pending_changes(&self) -> usize {
        crate::sync::lock(&self.0.dirty).len()
    }

    /// A view with no reconciler behind it, set by hand with [`Self::publish`] and
    /// [`Self::remove`]: the status manager's input in its tests and benches.
    pub fn detached() -> Self {
        Self(Arc::new(Shared::new()))
    }

    /// Sets a pod's view as the reconciler would (only for a [`Self::detached`] handle).
    pub fn publish(&self, view: PodView) {
        let uid = view.uid;
        self.0.view_mut().insert(uid, view);
        self.0.changed(uid);
    }

    /// Removes a pod as the reconciler would (only for a [`Self::detached`] handle).
    pub fn remove(&self, uid: PodUid) {
        self.0.view_mut().remove(&uid);
        self.0.changed(uid);
    }

    /// Waits until `pred` holds for the view (checked at every change), up to `timeout`.
    pub async fn wait_for(
        &self,
        timeout: Duration,
        mut pred: impl FnMut(&NodeView) -> bool,
    ) -> bool {
        let mut rx = self.changes();
        tokio::time::timeout(timeout, async {
            loop {
                if pred(&self.0.view()) {
                    return;
                }
                if rx.changed().await.is_err() {
                    // The reconciler is gone: the view will not change again.
                    std::future::pending::<()>().await;
                }
            }
        })
        .await
        .is_ok()
    }
}
