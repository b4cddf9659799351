//! [`StatusManager`]: the façade the agent calls. It owns the pod reflector, the writer and the
//! event publisher, and runs them in one loop; the agent talks to it through a cheap
//! [`StatusHandle`].
//!
//! - The loop takes the pods whose reconciled view changed straight from the reconciler
//!   ([`ReconcileHandle::changed_pods`], one queue: the newest view of a pod wins), so a burst of
//!   changes is computed once and written once.
//! - The loop computes what the mode says, skips the write when it equals (normalised, as kubelet
//!   does) what was last sent or what the API already has, and hands the patch to the writer:
//!   one request in flight per pod, the newest state next.
//! - A pod the reflector has not seen yet waits (its spec says which containers should run);
//!   it is computed again when the pod arrives. A 404 or a UID conflict stops writes for that
//!   UID: the pod is gone, or its name now belongs to a new pod.
//! - Kernel events (OOM kills, deaths) become Events in every mode but `off`; in `audit` mode
//!   kubelet's status is compared with the kernel's account instead of writing. A kill the
//!   probes saw before the kernel log's report of it was read is held (per kill, with a
//!   deadline, never by waiting in the loop) until the report comes or
//!   [`SCOPE_GRACE`](crate::reconcile::SCOPE_GRACE) has passed since the kill, so that its
//!   Event names the scope (or says it is unknown, and why).
//! - Per-pod state is dropped when the pod leaves the node view; what it remembers of a pod is
//!   bounded by the containers the view still has.
use std::{
    collections::{HashMap, HashSet},
    sync::{atomic::Ordering, Arc},
    time::{Duration, SystemTime},
};

use ::kube::{runtime::events::Reporter, Client};
use futures::{stream::BoxStream, StreamExt};
use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
use serde_json::Value;
use tokio::{
    sync::{mpsc, oneshot},
    time::Instant,
};

#[cfg(test)]
use super::compute::{compute_status, ComputedStatus, StatusInputs};
use super::{
    audit::FindingKind,
    conditions::ConditionTypes,
    events::{EventPublisher, EventStats},
    writer::StatusWriter,
    StatusConfig, StatusMode,
};
use crate::{
    kube::pods::{self, NodePods, PodChange},
    model::{PodUid, SharedClock},
    ratelimit::KeyedLimiter,
    reconcile::{PodView, ReconcileHandle},
};
use stats::bump;
pub use stats::StatusStats;

/// What a flush left undone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlushReport {
    /// Pods whose status was still not written at the deadline.
    pub unwritten: usize,
    /// Events still queued at the deadline.
    pub events_pending: u64,
}

enum Cmd {
    Flush(Duration, oneshot::Sender<FlushReport>),
}

/// The agent's side of the manager. Cheap to clone.
#[derive(Clone)]
pub struct StatusHandle {
    stats: Arc<StatusStats>,
    cmds: mpsc::UnboundedSender<Cmd>,
    pods: NodePods,
    reconcile: ReconcileHandle,
    events: Arc<EventStats>,
    cfg: Arc<StatusConfig>,
}

impl StatusHandle {
    /// What the manager writes.
    pub fn mode(&self) -> StatusMode {
        self.cfg.mode
    }

    /// Writes what is pending now, retries without waiting out back-offs, and waits until
    /// everything is written or `deadline` has passed (SIGTERM).
    pub async fn flush(&self, deadline: Duration) -> FlushReport {
        let (tx, rx) = oneshot::channel();
        let pending = || FlushReport {
            unwritten: self.reconcile.pending_changes(),
            events_pending: self.events.pending.load(Ordering::Relaxed),
        };
        if self.cmds.send(Cmd::Flush(deadline, tx)).is_err() {
            return pending();
        }
        match tokio::time::timeout(deadline + Duration::from_millis(100), rx).await {
            Ok(Ok(report)) => report,
            _ => pending(),
        }
    }

    pub fn stats(&self) -> &StatusStats {
        &self.stats
    }

    /// `Ok` once the API listed this node's pods; else why not (for `/readyz`).
    pub fn listed(&self) -> Result<(), String> {
        self.pods.listed()
    }

    /// The event publisher's counters (queued, published, failed, rate-limited, overflow).
    pub(crate) fn event_stats(&self) -> &EventStats {
        &self.events
    }

    /// The full PodStatus the agent computes for a view (the tests' view of the computation).
    #[cfg(test)]
    pub(crate) fn compute(&self, view: &PodView) -> ComputedStatus {
        let pod = self.pods.by_uid(view.uid.as_str());
        compute_status(&StatusInputs {
            pod: pod.as_deref(),
            view,
            previous: None,
            now: SystemTime::now(),
            runtime: &self.cfg.runtime_name,
            types: &self.cfg.condition_types(),
        })
    }

    /// This node's pods as the reflector has them.
    pub fn pods(&self) -> &NodePods {
        &self.pods
    }
}

/// The manager's start on the wall clock and on tokio's.
struct Epoch {
    /// Deaths and kills before this are history: not published again at start.
    wall: SystemTime,
    at: Instant,
}

/// Dedup keys of what was already said about a pod.
type KillKey = (String, u32, u64);

#[derive(Default)]
struct PodState {
    view: Option<PodView>,
    /// The first observation not yet written (latency is measured from there).
    observed_at: Option<Instant>,
    /// Normalised desired state last handed to the writer, and last acknowledged.
    submitted: Option<Arc<Value>>,
    written: Option<Arc<Value>>,
    /// The observer's conditions as last computed (their transition times).
    conditions: Vec<PodCondition>,
    /// `full`: the status last computed (kubelet's status cache).
    status: Option<PodStatus>,
    /// 404 or UID conflict: nothing more is written for this UID.
    gone: bool,
    deaths: HashSet<String>,
    kills: HashSet<KillKey>,
    /// Memory warnings told: (container id, which of its warnings).
    warnings: HashSet<(String, u32)>,
    findings: HashSet<(String, FindingKind)>,
    /// Kills whose Event waits for the kernel log's report, and until when.
    held: HashMap<KillKey, Instant>,
}

impl PodState {
    /// Forget what concerns containers the view no longer has: bounded by the runtime's GC.
    fn prune(&mut self, view: &PodView) {
        let ids: HashSet<&str> = view.containers.iter().map(|c| c.id.as_str()).collect();
        self.deaths.retain(|id| ids.contains(id.as_str()));
        self.kills.retain(|(id, _, _)| ids.contains(id.as_str()));
        self.warnings.retain(|(id, _)| ids.contains(id.as_str()));
        self.findings.retain(|(id, _)| ids.contains(id.as_str()));
        self.held.retain(|(id, _, _), _| ids.contains(id.as_str()));
    }
}

/// The status manager; run it with [`StatusManager::run`].
pub struct StatusManager {
    cfg: Arc<StatusConfig>,
    types: ConditionTypes,
    stats: Arc<StatusStats>,
    reconcile: ReconcileHandle,
    cmds: mpsc::UnboundedReceiver<Cmd>,
    pods: NodePods,
    changes: BoxStream<'static, PodChange>,
    writer: StatusWriter,
    events: EventPublisher,
    /// Per-pod rate limit of log lines.
    logs: KeyedLimiter<PodUid>,
    events_worker: Option<futures::future::BoxFuture<'static, ()>>,
    state: HashMap<PodUid, PodState>,
    /// The wall clock, read once at the start (what is history) and then followed on tokio's
    /// monotonic clock, so that a wall-clock step never moves transition times and paused-time
    /// tests see time pass.
    epoch: Epoch,
    flushes: Vec<(Instant, oneshot::Sender<FlushReport>)>,
    /// Audit: when to look at a pod again (a death the API has not caught up with yet).
    rechecks: HashMap<PodUid, Instant>,
    /// Pods with a kill's Event held for its report: the earliest deadline of each.
    held: HashMap<PodUid, Instant>,
    /// Whether the API lists the pods the runtime runs (a wrong node name).
    listing: listing::Listing,
    /// Shared with the fast path (`conditions` mode): who writes ContainersAlive's False.
    ledger: Option<Arc<super::ledger::AliveLedger>>,
    /// The ledger's signal: a fast-path claim was answered, the pod's turn again.
    answers: Option<crate::sync::BellWaiter>,
    /// A write failed for want of the API server (transport error, no answer): the first write
    /// that succeeds again ends every pod's back-off.
    api_away: bool,
}

impl StatusManager {
    /// The manager of the pods `reconcile` has, and its handle. Nothing happens until
    /// [`StatusManager::run`] is polled.
    pub fn new(
        client: Client,
        cfg: StatusConfig,
        reconcile: ReconcileHandle,
    ) -> (Self, StatusHandle) {
        let (pods, changes) = pods::watch(client.clone(), &cfg.node_name, &cfg.api_url);
        let writer = StatusWriter::new(client.clone(), &cfg);
        let reporter = Reporter {
            controller: cfg.reporter.clone(),
            instance: Some(cfg.node_name.clone()),
        };
        let (events, worker) =
            EventPublisher::new(client, reporter, cfg.events.clone(), &cfg.api_url);
        let event_stats = events.stats();
        let stats = Arc::new(StatusStats::default());
        let (tx, rx) = mpsc::unbounded_channel();
        let cfg = Arc::new(cfg);
        let handle = StatusHandle {
            stats: Arc::clone(&stats),
            cmds: tx,
            pods: pods.clone(),
            reconcile: reconcile.clone(),
            events: event_stats,
            cfg: Arc::clone(&cfg),
        };
        let me = Self {
            logs: KeyedLimiter::new(cfg.pod_logs, cfg.events.max_pods),
            types: cfg.condition_types(),
            cfg,
            stats,
            reconcile,
            cmds: rx,
            pods,
            changes,
            writer,
            events,
            events_worker: Some(Box::pin(worker)),
            state: HashMap::new(),
            epoch: Epoch {
                wall: SystemTime::UNIX_EPOCH,
                at: Instant::now(),
            },
            flushes: Vec::new(),
            rechecks: HashMap::new(),
            held: HashMap::new(),
            listing: Default::default(),
            ledger: None,
            answers: None,
            api_away: false,
        };
        (me.with_clock(crate::model::system_clock()), handle)
    }

    /// Reads the wall clock from `clock` (the agent's, shared with the fast path and the
    /// reconciler; a fake one in tests): what is history, and the transition times.
    pub(crate) fn with_clock(mut self, clock: SharedClock) -> Self {
        self.epoch = Epoch {
            wall: clock.now(),
            at: Instant::now(),
        };
        self
    }

    /// Shares ContainersAlive's truth with the fast path ([`super::ledger`]), and takes the
    /// ledger's signal: an answered claim is the pod's turn again.
    pub(crate) fn set_alive_ledger(&mut self, ledger: Arc<super::ledger::AliveLedger>) {
        self.answers = ledger.take_waiter();
        self.ledger = Some(ledger);
    }

    /// The pods whose fast-path claim was answered since the last look: computed again (their
    /// view did not change; the claim did). Arms the signal first, so that no answer falls
    /// between this look and the wait.
    fn take_answered(&mut self) {
        let Some(l) = &self.ledger else { return };
        if let Some(w) = &self.answers {
            w.arm();
        }
        let now = Instant::now();
        let answered: Vec<(PodUid, Instant)> =
            l.take_answered().into_iter().map(|u| (u, now)).collect();
        if !answered.is_empty() {
            self.take(answered);
        }
    }

    /// The runtime's name for container ids (`<runtime>://<id>`), known once it answered.
    pub(crate) fn with_runtime_name(mut self, name: String) -> Self {
        Arc::make_mut(&mut self.cfg).runtime_name = name;
        self
    }

    /// The Events' publishing, to run beside [`Self::run`] (the agent supervises it); left
    /// here, `run` spawns it.
    pub(crate) fn take_events_worker(&mut self) -> Option<futures::future::BoxFuture<'static, ()>> {
        self.events_worker.take()
    }

    /// Runs until every handle is dropped. The reflector, the writes and the events all run
    /// here (the events' publishing in a task of its own).
    pub async fn run(mut self) {
        let _events = self
            .events_worker
            .take()
            .map(|w| crate::sync::AbortOnDrop(tokio::spawn(w)));
        let reconcile = self.reconcile.clone();
        loop {
            self.take_answered();
            self.answer_flushes();
            let deadline = self.flushes.iter().map(|(d, _)| *d).min();
            let recheck = self.rechecks.values().min().copied();
            let held = self.held.values().min().copied();
            let node_check = self.listing.check_due();
            tokio::select! {
                biased;
                changed = reconcile.changed_pods() => self.take(changed),
                cmd = self.cmds.recv() => match cmd {
                    Some(Cmd::Flush(within, tx)) => {
                        self.take(self.reconcile.take_changed());
                        self.writer.expedite();
                        self.flushes.push((Instant::now() + within, tx));
                    }
                    None => return,
                },
                Some(change) = self.changes.next() => self.pod_change(change),
                done = self.writer.next() => self.finished(done),
                () = rung(&mut self.answers) => {}
                _ = sleep_until(deadline), if deadline.is_some() => {}
                _ = sleep_until(recheck), if recheck.is_some() => self.recheck(),
                _ = sleep_until(held), if held.is_some() => self.release_held(),
                _ = sleep_until(node_check), if node_check.is_some() => self.check_node_name(),
            }
        }
    }

    fn answer_flushes(&mut self) {
        if self.flushes.is_empty() {
            return;
        }
        let now = Instant::now();
        let events_pending = self.events.pending();
        // A kill's Event held for its report is still to be published.
        let done = self.writer.is_idle() && events_pending == 0 && self.held.is_empty();
        let report = FlushReport {
            unwritten: self.writer.pending(),
            events_pending,
        };
        let mut keep = Vec::new();
        for (deadline, tx) in self.flushes.drain(..) {
            if done || now >= deadline {
                let _ = tx.send(report);
            } else {
                keep.push((deadline, tx));
            }
        }
        // Back-offs are cut once, when the flush starts: a server that keeps failing is not
        // hammered until the deadline.
        self.flushes = keep;
    }

    /// Pods whose view changed: computed from the newest view, or forgotten when it is gone.
    fn take(&mut self, changed: Vec<(PodUid, Instant)>) {
        for (uid, at) in changed {
            let Some(view) = self.reconcile.pod(&uid) else {
                self.forget(&uid);
                continue;
            };
            bump(&self.stats.observed);
            let st = self.state.entry(uid).or_default();
            st.observed_at.get_or_insert(at);
            st.view = Some(view);
            self.process(&uid);
        }
    }

    fn now(&self) -> SystemTime {
        self.epoch.wall + self.epoch.at.elapsed()
    }

    fn forget(&mut self, uid: &PodUid) {
        self.listing.forget(uid);
        self.state.remove(uid);
        if let Some(l) = &self.ledger {
            l.forget(uid);
        }
        self.rechecks.remove(uid);
        self.held.remove(uid);
        self.writer.forget(uid);
        self.events.forget(uid.as_str());
        self.logs.forget(uid);
    }

    fn pod_change(&mut self, change: PodChange) {
        // The watch answers again: the API server is back, the writes waiting for it go now.
        if !matches!(change, PodChange::Error(_)) && std::mem::take(&mut self.api_away) {
            self.writer.expedite();
        }
        match change {
            PodChange::Applied { uid } => {
                // A mirror pod changed: its static pod is known by the UID in its annotation.
                let key = PodUid::parse(&uid)
                    .filter(|u| self.state.contains_key(u))
                    .or_else(|| {
                        self.pods.by_uid(&uid).and_then(|p| {
                            p.metadata
                                .annotations
                                .as_ref()
                                .and_then(|a| a.get("kubernetes.io/config.mirror"))
                                .and_then(|m| PodUid::parse(m))
                        })
                    });
                if let Some(key) = key {
                    if let Some(st) = self.state.get_mut(&key) {
                        st.gone = false;
                        self.process(&key);
                    }
                }
            }
            PodChange::Deleted { uid } => {
                // Not a pod of this node's views (no UID of the shape kubelet gives): nothing kept.
                let Some(uid) = PodUid::parse(&uid) else {
                    return;
                };
                self.writer.forget(&uid);
                if let Some(st) = self.state.get_mut(&uid) {
                    st.gone = true;
                    st.submitted = None;
                }
            }
            // Pods applied during the relist are in the store only now.
            PodChange::Resynced => {
                self.listing.listed();
                let uids: Vec<PodUid> = self.state.keys().copied().collect();
                for uid in uids {
                    self.process(&uid);
                }
            }
            PodChange::Error(_) => bump(&self.stats.watch_errors),
        }
    }

    fn process(&mut self, uid: &PodUid) {
        if self.cfg.mode == StatusMode::Off {
            return;
        }
        let Some(view) = self.state.get(uid).and_then(|s| s.view.clone()) else {
            return;
        };
        let pod = self.pods.of_view(&view);
        self.listing.track(uid, &view, pod.is_some());
        let now = self.now();
        self.kernel_events(&view, pod.as_deref());
        match self.cfg.mode {
            StatusMode::Off => {}
            StatusMode::Audit => self.audit(&view, pod.as_deref(), now),
            StatusMode::Conditions | StatusMode::Full => {
                let Some(pod) = pod else {
                    bump(&self.stats.waiting_for_pod);
                    return;
                };
                self.write(&view, &pod, now);
            }
        }
    }
}

/// The ledger's signal (never, without one).
async fn rung(answers: &mut Option<crate::sync::BellWaiter>) {
    match answers {
        Some(w) => w.wait().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

mod listing;
mod notes;
mod podlog;
mod stats;
mod write;

#[cfg(test)]
pub(crate) mod testkit;
#[cfg(test)]
mod tests;
