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
//!   kubelet's status is compared with the kernel's account instead of writing.
//! - Per-pod state is dropped when the pod leaves the node view; what it remembers of a pod is
//!   bounded by the containers the view still has.
use std::{
    collections::{HashMap, HashSet},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use ::kube::{runtime::events::Reporter, Client};
use futures::{stream::BoxStream, StreamExt};
use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus};
use serde_json::Value;
use tokio::{
    sync::{mpsc, oneshot},
    time::Instant,
};

use super::{
    audit::{audit, FindingKind},
    compute::{compute_status, ComputedStatus, StatusInputs},
    conditions::{memory_limit, observer_conditions, survived, ConditionTypes},
    events::{EventPublisher, EventStats, PodEvent},
    patch::{conditions_patch, normalize, status_patch},
    pods::{self, NodePods, PodChange},
    writer::{StatusWriter, WriteDone, WriteJob, WriteOutcome},
    StatusConfig, StatusMode,
};
use crate::{
    cgroup::PodUid,
    cri::PodRef,
    ratelimit::{KeyedLimiter, Take},
    reconcile::{ContainerPhase, PodView, ReconcileHandle},
};

/// Counters for metrics, readable while the manager runs.
#[derive(Debug, Default)]
pub struct StatusStats {
    /// Changed views taken from the reconciler.
    pub observed: AtomicU64,
    /// Pod statuses (or condition sets) computed.
    pub computed: AtomicU64,
    /// Patches handed to the writer.
    pub submitted: AtomicU64,
    /// Patches the API accepted.
    pub writes: AtomicU64,
    /// Computations that needed no write (equal to the last sent, or to the API's).
    pub unchanged: AtomicU64,
    /// Failed attempts (5xx, timeouts, transport); each is retried.
    pub write_errors: AtomicU64,
    /// 429s (retried after the server's Retry-After); not in `write_errors`.
    pub throttled: AtomicU64,
    /// 404: the pod was gone.
    pub gone: AtomicU64,
    /// 409: the UID precondition failed (a re-created pod).
    pub conflicts: AtomicU64,
    /// 400/422: the server refused the patch.
    pub rejected: AtomicU64,
    /// Computations put off because the reflector did not have the pod yet.
    pub waiting_for_pod: AtomicU64,
    /// Events handed to the publisher (it counts what it published, dropped and failed).
    pub events: AtomicU64,
    /// Audit findings by [`FindingKind`] (index [`FindingKind::index`]).
    pub audit_findings: [AtomicU64; 4],
    /// Pod watch errors (the API unreachable).
    pub watch_errors: AtomicU64,
    /// Log lines about a pod dropped over its rate limit.
    pub logs_suppressed: AtomicU64,
}

impl StatusStats {
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// A log line about a pod, under the pod's rate limit, so that a crash-looping pod cannot flood
/// the node's log pipeline. The first line allowed after some were dropped says how many.
fn pod_log(
    limits: &mut KeyedLimiter<String>,
    stats: &StatusStats,
    uid: &str,
    pod: &str,
    line: impl FnOnce(),
) {
    match limits.take(uid) {
        Take::Allowed { denied_before } => {
            if denied_before > 0 {
                tracing::info!(
                    pod,
                    dropped = denied_before,
                    "log lines about this pod over its rate limit were dropped"
                );
            }
            line();
        }
        Take::Denied => bump(&stats.logs_suppressed),
    }
}

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
    pub fn event_stats(&self) -> &EventStats {
        &self.events
    }

    /// This node's pods as the reflector has them.
    pub fn pods(&self) -> &NodePods {
        &self.pods
    }

    /// The full PodStatus the agent computes for a view, with what it cannot know
    /// (`observer status -o yaml`). Works without the API: the spec is then absent.
    pub fn compute(&self, view: &PodView) -> ComputedStatus {
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
    findings: HashSet<(String, FindingKind)>,
}

impl PodState {
    /// Forget what concerns containers the view no longer has: bounded by the runtime's GC.
    fn prune(&mut self, view: &PodView) {
        let ids: HashSet<&str> = view.containers.iter().map(|c| c.id.as_str()).collect();
        self.deaths.retain(|id| ids.contains(id.as_str()));
        self.kills.retain(|(id, _, _)| ids.contains(id.as_str()));
        self.findings.retain(|(id, _)| ids.contains(id.as_str()));
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
    logs: KeyedLimiter<String>,
    events_worker: Option<futures::future::BoxFuture<'static, ()>>,
    event_stats: Arc<EventStats>,
    state: HashMap<String, PodState>,
    /// Deaths and kills before this are history: not published again at start.
    started: SystemTime,
    /// The wall clock is read once; later times are this plus tokio's monotonic clock, so that
    /// a wall-clock step never moves transition times and paused-time tests see time pass.
    epoch: (SystemTime, Instant),
    flushes: Vec<(Instant, oneshot::Sender<FlushReport>)>,
    /// Audit: when to look at a pod again (a death the API has not caught up with yet).
    rechecks: HashMap<String, Instant>,
    /// The API listed this node's pods at least once.
    listed: bool,
    /// Pods the runtime runs that the API does not list for this node, and since when.
    unlisted: HashMap<String, Instant>,
    /// Said for the pods unlisted now; said again once all were found and some go missing again.
    node_warned: bool,
}

/// How long a running pod may be missing from the API's pods of this node before the node name
/// is doubted: the API has a pod before its sandbox exists, so only a watch lagging can hide it.
const UNLISTED_GRACE: Duration = Duration::from_secs(3);

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
        let (events, worker) = EventPublisher::new(client, reporter, cfg.events.clone());
        let event_stats = events.stats();
        let stats = Arc::new(StatusStats::default());
        let (tx, rx) = mpsc::unbounded_channel();
        let cfg = Arc::new(cfg);
        let handle = StatusHandle {
            stats: Arc::clone(&stats),
            cmds: tx,
            pods: pods.clone(),
            reconcile: reconcile.clone(),
            events: Arc::clone(&event_stats),
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
            event_stats,
            state: HashMap::new(),
            started: SystemTime::now(),
            epoch: (SystemTime::now(), Instant::now()),
            flushes: Vec::new(),
            rechecks: HashMap::new(),
            listed: false,
            unlisted: HashMap::new(),
            node_warned: false,
        };
        (me, handle)
    }

    /// The Events' publishing, to run beside [`Self::run`] (the agent supervises it); left
    /// here, `run` spawns it.
    pub fn take_events_worker(&mut self) -> Option<futures::future::BoxFuture<'static, ()>> {
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
            self.answer_flushes();
            let deadline = self.flushes.iter().map(|(d, _)| *d).min();
            let recheck = self.rechecks.values().min().copied();
            let node_check = self.node_check_due();
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
                _ = sleep_until(deadline), if deadline.is_some() => {}
                _ = sleep_until(recheck), if recheck.is_some() => self.recheck(),
                _ = sleep_until(node_check), if node_check.is_some() => self.check_node_name(),
            }
        }
    }

    fn answer_flushes(&mut self) {
        if self.flushes.is_empty() {
            return;
        }
        let now = Instant::now();
        let events_pending = self.event_stats.pending.load(Ordering::Relaxed);
        let done = self.writer.is_idle() && events_pending == 0;
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
            let key = uid.to_string();
            let Some(view) = self.reconcile.pod(&uid) else {
                self.forget(&key);
                continue;
            };
            bump(&self.stats.observed);
            let st = self.state.entry(key.clone()).or_default();
            st.observed_at.get_or_insert(at);
            st.view = Some(view);
            self.process(&key);
        }
    }

    fn now(&self) -> SystemTime {
        self.epoch.0 + self.epoch.1.elapsed()
    }

    fn recheck(&mut self) {
        let now = Instant::now();
        let due: Vec<String> = self
            .rechecks
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in due {
            self.rechecks.remove(&uid);
            self.process(&uid);
        }
    }

    /// When pods missing from the API's list will have been missing for the grace.
    fn node_check_due(&self) -> Option<Instant> {
        if !self.listed || self.node_warned {
            return None;
        }
        self.unlisted
            .values()
            .min()
            .map(|since| *since + UNLISTED_GRACE)
    }

    /// Running pods the API does not list for this node: the node name is likely wrong, and
    /// nothing is written for them.
    fn check_node_name(&mut self) {
        let now = Instant::now();
        let mut missing: Vec<String> = self
            .unlisted
            .iter()
            .filter(|(_, since)| **since + UNLISTED_GRACE <= now)
            .filter_map(|(uid, _)| self.state.get(uid)?.view.as_ref())
            .map(|v| format!("{}/{}", v.namespace, v.name))
            .collect();
        if missing.is_empty() {
            return;
        }
        missing.sort();
        let n = missing.len();
        missing.truncate(3);
        tracing::warn!(
            "{n} pod(s) the runtime runs here are not among the API's pods of node {:?} ({}{}): is --node-name (NODE_NAME) this node's name as the API knows it (kubectl get nodes)? Nothing is written for them",
            self.cfg.node_name,
            missing.join(", "),
            if n > 3 { ", ..." } else { "" },
        );
        self.node_warned = true;
    }

    /// Whether the API lists the pod the runtime runs.
    fn track_listing(&mut self, uid: &str, view: &PodView, listed: bool) {
        if listed || !view.sandbox_ready {
            self.unlisted.remove(uid);
            self.node_warned &= !self.unlisted.is_empty();
        } else {
            self.unlisted
                .entry(uid.to_string())
                .or_insert_with(Instant::now);
        }
    }

    fn forget(&mut self, uid: &str) {
        self.unlisted.remove(uid);
        self.node_warned &= !self.unlisted.is_empty();
        self.state.remove(uid);
        self.rechecks.remove(uid);
        self.writer.forget(uid);
        self.events.forget(uid);
        self.logs.forget(uid);
    }

    fn pod_change(&mut self, change: PodChange) {
        match change {
            PodChange::Applied { uid } => {
                // A mirror pod changed: its static pod is known by the UID in its annotation.
                let key = if self.state.contains_key(&uid) {
                    Some(uid)
                } else {
                    self.pods.by_uid(&uid).and_then(|p| {
                        p.metadata
                            .annotations
                            .as_ref()
                            .and_then(|a| a.get("kubernetes.io/config.mirror").cloned())
                    })
                };
                if let Some(st) = key.as_ref().and_then(|k| self.state.get_mut(k)) {
                    st.gone = false;
                    if let Some(k) = key {
                        self.process(&k);
                    }
                }
            }
            PodChange::Deleted { uid } => {
                self.writer.forget(&uid);
                if let Some(st) = self.state.get_mut(&uid) {
                    st.gone = true;
                    st.submitted = None;
                }
            }
            // Pods applied during the relist are in the store only now.
            PodChange::Resynced => {
                if !self.listed {
                    // Missing before the first list meant nothing.
                    self.listed = true;
                    self.unlisted.clear();
                }
                let uids: Vec<String> = self.state.keys().cloned().collect();
                for uid in uids {
                    self.process(&uid);
                }
            }
            PodChange::Error(_) => bump(&self.stats.watch_errors),
        }
    }

    fn finished(&mut self, done: WriteDone) {
        let stats = &*self.stats;
        let Ok((job, outcome)) = done.output else {
            bump(&stats.write_errors);
            return;
        };
        let st = self.state.get_mut(&job.uid);
        match outcome {
            WriteOutcome::Written { sent_at } => {
                bump(&stats.writes);
                let latency = sent_at.saturating_duration_since(job.observed_at);
                if let Some(h) = &self.cfg.write_latency {
                    h.observe(latency.as_secs_f64());
                }
                if let Some(st) = st {
                    st.written = Some(job.desired);
                }
            }
            WriteOutcome::Gone | WriteOutcome::Conflict => {
                if matches!(outcome, WriteOutcome::Gone) {
                    bump(&stats.gone);
                } else {
                    bump(&stats.conflicts);
                }
                pod_log(&mut self.logs, stats, &job.uid, &job.name, || {
                    tracing::info!(pod = %job.name, uid = %job.uid, "status not written: {outcome:?}; the pod's work is dropped");
                });
                if let Some(st) = st {
                    st.gone = true;
                    st.submitted = None;
                }
            }
            WriteOutcome::Rejected(e) => {
                bump(&stats.rejected);
                pod_log(&mut self.logs, stats, &job.uid, &job.name, || {
                    tracing::error!(pod = %job.name, "status patch refused: {e}");
                });
                if let Some(st) = st {
                    st.submitted = None;
                }
            }
            WriteOutcome::Throttled(after) => {
                bump(&stats.throttled);
                tracing::debug!(pod = %job.name, ?after, "status write throttled");
            }
            WriteOutcome::Failed(e) => {
                bump(&stats.write_errors);
                // A crash-looping pod or an API outage would log every retry: powers of two.
                if done.failures.is_power_of_two() {
                    pod_log(&mut self.logs, stats, &job.uid, &job.name, || {
                        tracing::warn!(pod = %job.name, failures = done.failures, "status write failed: {e}; retrying");
                    });
                }
            }
        }
    }

    fn pod_ref(view: &PodView, pod: Option<&Pod>) -> PodRef {
        // Events regard the API's pod: a static pod's mirror has a UID of its own.
        let uid = pod
            .and_then(|p| p.metadata.uid.clone())
            .unwrap_or_else(|| view.uid.to_string());
        PodRef {
            uid,
            namespace: view.namespace.clone(),
            name: view.name.clone(),
        }
    }

    fn process(&mut self, uid: &str) {
        if self.cfg.mode == StatusMode::Off {
            return;
        }
        let Some(view) = self.state.get(uid).and_then(|s| s.view.clone()) else {
            return;
        };
        let pod = resolve(&self.pods, &view);
        self.track_listing(uid, &view, pod.is_some());
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

    /// Computes what the mode writes and hands it to the writer unless nothing changed.
    fn write(&mut self, view: &PodView, pod: &Pod, now: SystemTime) {
        let stats = &self.stats;
        let Some(st) = self.state.get_mut(view.uid.as_str()) else {
            return;
        };
        if st.gone {
            return;
        }
        bump(&stats.computed);
        // The precondition is the API's UID (a static pod's mirror has its own).
        let api_uid = pod
            .metadata
            .uid
            .clone()
            .unwrap_or_else(|| view.uid.to_string());
        let api = pod.status.clone().unwrap_or_default();
        let api_conditions = api.conditions.as_deref().unwrap_or(&[]);
        let result = if self.cfg.mode == StatusMode::Conditions {
            // Transition times from what this agent last computed, else from the API.
            let mut old: Vec<PodCondition> = st.conditions.clone();
            old.extend(
                api_conditions
                    .iter()
                    .filter(|c| !st.conditions.iter().any(|o| o.type_ == c.type_))
                    .cloned(),
            );
            let desired = observer_conditions(pod.spec.as_ref(), view, &old, &self.types, now);
            let normal = serde_json::to_value(&desired).map_err(super::KubeError::from);
            let patch = conditions_patch(&api_uid, api_conditions, &desired);
            st.conditions = desired;
            normal.and_then(|n| patch.map(|p| (n, p)))
        } else {
            let computed = compute_status(&StatusInputs {
                pod: Some(pod),
                view,
                previous: st.status.as_ref(),
                now,
                runtime: &self.cfg.runtime_name,
                types: &self.types,
            });
            let normal = normalize(&computed.status);
            let patch = status_patch(&api_uid, &api, &computed.status);
            st.status = Some(computed.status);
            normal.and_then(|n| patch.map(|p| (n, p)))
        };
        let (normal, patch) = match result {
            Ok(r) => r,
            Err(e) => {
                pod_log(&mut self.logs, stats, view.uid.as_str(), &view.name, || {
                    tracing::error!(pod = %view.name, "status not computed: {e}");
                });
                return;
            }
        };
        let normal = Arc::new(normal);
        if st.submitted.as_deref() == Some(&*normal) {
            bump(&stats.unchanged);
            st.observed_at = None;
            return;
        }
        let Some(body) = patch else {
            // The API already says so.
            bump(&stats.unchanged);
            st.submitted = Some(Arc::clone(&normal));
            st.written = Some(normal);
            st.observed_at = None;
            return;
        };
        st.submitted = Some(Arc::clone(&normal));
        let observed_at = st.observed_at.take().unwrap_or_else(Instant::now);
        bump(&stats.submitted);
        self.writer.submit(WriteJob {
            namespace: view.namespace.clone(),
            name: view.name.clone(),
            uid: view.uid.to_string(),
            body: Arc::new(body),
            desired: normal,
            observed_at,
        });
    }

    /// OOM kills and deaths the kernel reported since the agent started, each once.
    fn kernel_events(&mut self, view: &PodView, pod: Option<&Pod>) {
        let spec = pod.and_then(|p| p.spec.as_ref());
        let is_init = |name: &str| {
            spec.and_then(|s| s.init_containers.as_ref())
                .is_some_and(|ic| ic.iter().any(|c| c.name == name))
        };
        let started = self.started;
        let Some(st) = self.state.get_mut(view.uid.as_str()) else {
            return;
        };
        st.prune(view);
        let mut out = Vec::new();
        for c in &view.containers {
            if c.phase == ContainerPhase::Exited && st.deaths.insert(c.id.to_string()) {
                let recent = c.finished_at.is_none_or(|f| f >= started);
                if recent && c.kernel_seen {
                    out.push(PodEvent::ContainerDied {
                        container: c.name.clone(),
                        init_container: is_init(&c.name),
                        exit_code: c.exit_code,
                        signal: c.signal,
                        reason: Some(super::compute::terminated_reason(c)),
                    });
                }
            }
            if let Some(o) = &c.last_oom {
                let secs = o.time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
                if st.kills.insert((c.id.to_string(), o.pid, secs)) && o.time >= started {
                    out.push(PodEvent::OomKill {
                        container: c.name.clone(),
                        init_container: is_init(&c.name),
                        victim: Box::new(o.clone()),
                        survived: survived(o, Some(c)),
                        limit: memory_limit(spec, &c.name),
                        view: Some(Box::new(c.clone())),
                    });
                }
            }
        }
        let pod_ref = Self::pod_ref(view, pod);
        for ev in out {
            bump(&self.stats.events);
            // The node's log says it too, for log pipelines (the Event may be rate-limited or
            // the API away).
            let (e, _) = ev.render();
            let note = e.note.as_deref().unwrap_or_default();
            pod_log(
                &mut self.logs,
                &self.stats,
                view.uid.as_str(),
                &view.name,
                || match ev {
                    PodEvent::OomKill { .. } => {
                        tracing::warn!(namespace = %view.namespace, pod = %view.name, reason = %e.reason, "{note}")
                    }
                    _ => {
                        tracing::info!(namespace = %view.namespace, pod = %view.name, reason = %e.reason, "{note}")
                    }
                },
            );
            self.events.publish(&pod_ref, &ev);
        }
    }

    fn audit(&mut self, view: &PodView, pod: Option<&Pod>, now: SystemTime) {
        let Some(api) = pod.and_then(|p| p.status.as_ref()) else {
            bump(&self.stats.waiting_for_pod);
            return;
        };
        let grace = self.cfg.audit_running_grace;
        let findings = audit(api, view, now, grace);
        if let Some(due) = still_running_due(api, view, now, grace) {
            self.rechecks
                .insert(view.uid.to_string(), Instant::now() + due);
        }
        let pod_ref = Self::pod_ref(view, pod);
        let Some(st) = self.state.get_mut(view.uid.as_str()) else {
            return;
        };
        for f in findings {
            if !st.findings.insert((f.container_id.clone(), f.kind)) {
                continue;
            }
            bump(&self.stats.audit_findings[f.kind.index()]);
            bump(&self.stats.events);
            pod_log(
                &mut self.logs,
                &self.stats,
                view.uid.as_str(),
                &view.name,
                || tracing::warn!(namespace = %view.namespace, pod = %view.name, finding = %f.kind, "{}", f.message()),
            );
            self.events.publish(&pod_ref, &PodEvent::Audit(f));
        }
    }
}

/// The API's pod for a view: by UID, else a static pod's mirror (same name, its
/// `kubernetes.io/config.mirror` annotation naming the static pod's UID).
fn resolve(pods: &NodePods, view: &PodView) -> Option<Arc<Pod>> {
    pods.by_uid(view.uid.as_str()).or_else(|| {
        pods.get(&view.namespace, &view.name).filter(|p| {
            p.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("kubernetes.io/config.mirror"))
                .is_some_and(|m| m == view.uid.as_str())
        })
    })
}

/// When a death the API still shows as Running passes the audit's grace, if one is pending.
fn still_running_due(
    api: &PodStatus,
    view: &PodView,
    now: SystemTime,
    grace: Duration,
) -> Option<Duration> {
    let running_ids: Vec<&str> = api
        .container_statuses
        .iter()
        .chain(api.init_container_statuses.iter())
        .flatten()
        .filter(|s| s.state.as_ref().is_some_and(|st| st.running.is_some()))
        .filter_map(|s| s.container_id.as_deref())
        .map(|id| id.split_once("://").map_or(id, |(_, r)| r))
        .collect();
    view.containers
        .iter()
        .filter(|c| c.phase == ContainerPhase::Exited && running_ids.contains(&c.id.as_str()))
        .filter_map(|c| c.finished_at)
        .map(|f| (f + grace).duration_since(now).unwrap_or_default())
        .filter(|d| !d.is_zero())
        .min()
        // Just past the grace, so that the audit then finds it late.
        .map(|d| d + Duration::from_millis(10))
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests;
