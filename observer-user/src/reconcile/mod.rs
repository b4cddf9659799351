//! Reconciliation: the kernel knows when and how a process died; the runtime knows which container
//! it was, its name and restart count. The [`Reconciler`] merges the two into a [`NodeView`]
//! (see [`merge`] for who wins where) and repairs what either side missed.
//!
//! - Each PLEG event updates the view at once from the kernel's evidence, then asks the runtime
//!   about the pod: at most one request in flight per pod; events arriving meanwhile are batched
//!   into one follow-up request.
//! - A container the kernel reported but the runtime does not know yet is retried briefly, then
//!   dropped and counted.
//! - A full relist runs at start, every `relist_period`, and at once after the kernel dropped
//!   records or the runtime connection came back. Every difference it has to repair is counted as
//!   a missed event: the aim is zero.
pub mod evidence;
pub mod merge;
pub mod view;

use std::{
    collections::{HashMap, HashSet},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, RwLock,
    },
    time::Duration,
};

use k8s_cri::v1 as api;
use tokio::{
    sync::{broadcast, watch, Notify},
    task::JoinSet,
    time::Instant,
};

pub use evidence::KernelEvidence;
pub use view::{ContainerPhase, ContainerView, OomEvidence, PodView};

use crate::{
    cri::{keys, CriError, KubeletLabels, ReconnectingCri},
    kernel::BootClock,
    pleg::{PlegReceiver, PodLifecycleEvent},
};

#[derive(Clone, Debug)]
pub struct ReconcileConfig {
    /// Period of the safety relist.
    pub relist_period: Duration,
    /// How long a container the kernel reported may stay unknown to the runtime.
    pub unknown_grace: Duration,
}

impl Default for ReconcileConfig {
    fn default() -> Self {
        Self {
            relist_period: Duration::from_secs(60),
            unknown_grace: Duration::from_secs(2),
        }
    }
}

/// Counters, readable while the reconciler runs.
#[derive(Debug, Default)]
pub struct ReconcileStats {
    pub pleg_events: AtomicU64,
    pub pod_fetches: AtomicU64,
    pub fetch_errors: AtomicU64,
    pub relists: AtomicU64,
    /// Differences a relist had to repair: events the event-driven path missed.
    pub missed_events: AtomicU64,
    /// Containers or pods the runtime knew and the kernel never reported (not at start).
    pub adopted: AtomicU64,
    /// Containers the kernel reported that the runtime never came to know.
    pub unknown_dropped: AtomicU64,
    /// Containers where the kernel's account replaced the runtime's (reason or exit code).
    pub corrected: AtomicU64,
    /// Pod requests to the runtime in flight now (a gauge).
    pub in_flight: AtomicU64,
}

impl ReconcileStats {
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// The node as reconciled, by pod uid.
pub type NodeView = HashMap<String, PodView>;

/// Cheap to clone: read the view, wait for changes, ask for a relist, tap the PLEG events.
#[derive(Clone)]
pub struct ReconcileHandle {
    view: Arc<RwLock<NodeView>>,
    stats: Arc<ReconcileStats>,
    relist: Arc<Notify>,
    generation: watch::Receiver<u64>,
    pleg: broadcast::Sender<PodLifecycleEvent>,
}

impl ReconcileHandle {
    pub fn pods(&self) -> Vec<PodView> {
        let mut pods: Vec<PodView> = self
            .view
            .read()
            .expect("view lock")
            .values()
            .cloned()
            .collect();
        pods.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        pods
    }

    pub fn pod(&self, uid: &str) -> Option<PodView> {
        self.view.read().expect("view lock").get(uid).cloned()
    }

    pub fn stats(&self) -> &ReconcileStats {
        &self.stats
    }

    /// Bumped on every change of the view.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.generation.clone()
    }

    /// The PLEG events the reconciler consumed, as they arrive.
    pub fn pleg_events(&self) -> broadcast::Receiver<PodLifecycleEvent> {
        self.pleg.subscribe()
    }

    /// Waits for the first relist and the pod requests it started to be answered: the view then
    /// holds every pod the runtime has.
    pub async fn settled(&self, timeout: Duration) -> bool {
        let s = Arc::clone(&self.stats);
        tokio::time::timeout(timeout, async move {
            while ReconcileStats::get(&s.relists) == 0 || ReconcileStats::get(&s.in_flight) > 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .is_ok()
    }

    pub fn request_relist(&self) {
        self.relist.notify_one();
    }

    /// Waits until `pred` holds for the view (checked at every change), up to `timeout`.
    pub async fn wait_for(
        &self,
        timeout: Duration,
        mut pred: impl FnMut(&NodeView) -> bool,
    ) -> bool {
        let mut rx = self.changes();
        let check =
            |pred: &mut dyn FnMut(&NodeView) -> bool| pred(&self.view.read().expect("view lock"));
        tokio::time::timeout(timeout, async {
            loop {
                if check(&mut pred) {
                    return;
                }
                if rx.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        })
        .await
        .is_ok()
    }
}

/// What the runtime says about one pod.
#[derive(Debug, Default)]
struct PodSnapshot {
    sandboxes: Vec<api::PodSandbox>,
    containers: Vec<api::ContainerStatus>,
}

#[derive(Default)]
struct PodWork {
    in_flight: bool,
    dirty: bool,
    retry_at: Option<Instant>,
    failures: u32,
}

pub struct Reconciler {
    cri: ReconnectingCri,
    cfg: ReconcileConfig,
    clock: BootClock,
    view: Arc<RwLock<NodeView>>,
    stats: Arc<ReconcileStats>,
    relist: Arc<Notify>,
    generation: watch::Sender<u64>,
    pleg_tap: broadcast::Sender<PodLifecycleEvent>,
    /// Kernel evidence by container id, and which pod each container id belongs to.
    evidence: HashMap<String, KernelEvidence>,
    pod_of: HashMap<String, String>,
    /// Last runtime status of each container, to re-merge when only kernel evidence changes.
    cri_status: HashMap<String, api::ContainerStatus>,
    /// Since when a container the kernel reported is unknown to the runtime.
    unknown_since: HashMap<String, Instant>,
    /// Since when the runtime still calls running a container whose death the kernel reported.
    lagging_since: HashMap<String, Instant>,
    work: HashMap<String, PodWork>,
    fetches: JoinSet<(String, Result<PodSnapshot, CriError>)>,
    relisted_once: bool,
}

impl Reconciler {
    pub fn new(cri: ReconnectingCri, cfg: ReconcileConfig) -> (Self, ReconcileHandle) {
        let (generation, generation_rx) = watch::channel(0);
        let (pleg_tap, _) = broadcast::channel(4096);
        let me = Self {
            cri,
            cfg,
            clock: BootClock::new(),
            view: Arc::default(),
            stats: Arc::default(),
            relist: Arc::new(Notify::new()),
            generation,
            pleg_tap,
            evidence: HashMap::new(),
            pod_of: HashMap::new(),
            cri_status: HashMap::new(),
            unknown_since: HashMap::new(),
            lagging_since: HashMap::new(),
            work: HashMap::new(),
            fetches: JoinSet::new(),
            relisted_once: false,
        };
        let handle = ReconcileHandle {
            view: Arc::clone(&me.view),
            stats: Arc::clone(&me.stats),
            relist: Arc::clone(&me.relist),
            generation: generation_rx,
            pleg: me.pleg_tap.clone(),
        };
        (me, handle)
    }

    /// Runs until the PLEG stream ends.
    pub async fn run(mut self, mut pleg: PlegReceiver) {
        let mut conn = self.cri.subscribe();
        let mut seen_generation = conn.borrow().generation;
        let mut tick = tokio::time::interval(self.cfg.relist_period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let relist = Arc::clone(&self.relist);
        let (runtime_tx, mut runtime_events) = tokio::sync::mpsc::channel(1024);
        let _runtime_events = AbortOnDrop(tokio::spawn(follow_runtime_events(
            self.cri.clone(),
            runtime_tx,
        )));
        loop {
            let next_retry = self.work.values().filter_map(|w| w.retry_at).min();
            tokio::select! {
                ev = pleg.recv() => match ev {
                    Some(ev) => self.on_pleg(ev),
                    None => return,
                },
                Some(done) = self.fetches.join_next(), if !self.fetches.is_empty() => {
                    if let Ok((uid, result)) = done {
                        self.on_fetched(uid, result);
                    }
                }
                _ = tick.tick() => self.relist().await,
                _ = relist.notified() => self.relist().await,
                Ok(()) = conn.changed() => {
                    let state = conn.borrow_and_update().clone();
                    if state.connected && state.generation != seen_generation {
                        seen_generation = state.generation;
                        tracing::info!(reconnects = state.reconnects(), "CRI connection (re)established: relisting");
                        self.relist().await;
                    }
                }
                _ = sleep_until(next_retry), if next_retry.is_some() => self.retry_due(),
                Some(uid) = runtime_events.recv() => self.schedule(&uid),
            }
        }
    }

    fn on_pleg(&mut self, ev: PodLifecycleEvent) {
        bump(&self.stats.pleg_events);
        let _ = self.pleg_tap.send(ev.clone());
        let uid = ev.pod_uid.as_str().to_string();
        if let Some(cid) = ev.container_id {
            let cid = cid.as_str().to_string();
            self.pod_of.insert(cid.clone(), uid.clone());
            let changed = self.evidence.entry(cid.clone()).or_default().apply(&ev);
            if changed {
                self.remerge(&uid, &cid);
            }
        }
        self.schedule(&uid);
    }

    /// Re-merges one container from stored runtime status and new kernel evidence, so the view
    /// shows a death the moment the kernel reports it.
    fn remerge(&mut self, uid: &str, cid: &str) {
        let mut view = self.view.write().expect("view lock");
        let Some(pod) = view.get_mut(uid) else { return };
        if pod.sandbox_id == cid {
            if self.evidence.get(cid).is_some_and(|e| e.exit.is_some()) {
                pod.sandbox_ready = false;
            }
        } else if let Some(slot) = pod.containers.iter_mut().find(|c| c.id == cid) {
            *slot = merge::merge(
                cid,
                self.cri_status.get(cid),
                self.evidence.get(cid),
                &self.clock,
            );
            pod.last_oom = latest_oom(&pod.containers);
        } else {
            return;
        }
        drop(view);
        self.generation.send_modify(|g| *g += 1);
    }

    fn schedule(&mut self, uid: &str) {
        let w = self.work.entry(uid.to_string()).or_default();
        if w.in_flight {
            w.dirty = true;
            return;
        }
        w.in_flight = true;
        w.dirty = false;
        w.retry_at = None;
        bump(&self.stats.pod_fetches);
        bump(&self.stats.in_flight);
        let cri = self.cri.clone();
        let uid = uid.to_string();
        self.fetches.spawn(async move {
            let r = fetch_pod(&cri, &uid).await;
            (uid, r)
        });
    }

    fn retry_due(&mut self) {
        let now = Instant::now();
        let due: Vec<String> = self
            .work
            .iter()
            .filter(|(_, w)| w.retry_at.is_some_and(|t| t <= now) && !w.in_flight)
            .map(|(u, _)| u.clone())
            .collect();
        for uid in due {
            self.schedule(&uid);
        }
    }

    fn on_fetched(&mut self, uid: String, result: Result<PodSnapshot, CriError>) {
        self.stats.in_flight.fetch_sub(1, Ordering::Relaxed);
        let w = self.work.entry(uid.clone()).or_default();
        w.in_flight = false;
        let snapshot = match result {
            Ok(s) => {
                w.failures = 0;
                s
            }
            Err(e) => {
                bump(&self.stats.fetch_errors);
                w.failures += 1;
                // Disconnected: the relist after reconnecting fetches every pod. Otherwise back
                // off (100 ms doubling to 5 s) and try again: the last state must get through.
                if !matches!(e, CriError::Disconnected { .. }) {
                    let delay =
                        Duration::from_millis(100 << w.failures.min(6)).min(Duration::from_secs(5));
                    w.retry_at = Some(Instant::now() + delay);
                }
                if w.failures == 1 {
                    tracing::warn!(
                        pod = uid,
                        "runtime status of pod failed (retrying): {}",
                        e.chain()
                    );
                }
                return;
            }
        };
        let dirty = std::mem::take(&mut w.dirty);
        let retry = self.apply_snapshot(&uid, snapshot);
        if dirty {
            self.schedule(&uid);
        } else if retry {
            let w = self.work.entry(uid).or_default();
            w.retry_at = Some(Instant::now() + Duration::from_millis(100));
        } else if !self.view.read().expect("view lock").contains_key(&uid) {
            self.work.remove(&uid);
        }
    }

    /// Writes the pod's merged view. Returns true when some container the kernel reported is
    /// not known to the runtime yet (retry shortly).
    fn apply_snapshot(&mut self, uid: &str, snap: PodSnapshot) -> bool {
        let known: HashSet<&str> = snap
            .containers
            .iter()
            .map(|c| c.id.as_str())
            .chain(snap.sandboxes.iter().map(|s| s.id.as_str()))
            .collect();
        // Kernel-reported containers of this pod the runtime does not know.
        let mut waiting = false;
        let now = Instant::now();
        let reported: Vec<String> = self
            .pod_of
            .iter()
            .filter(|(_, p)| p.as_str() == uid)
            .map(|(c, _)| c.clone())
            .collect();
        for cid in reported {
            if known.contains(cid.as_str()) {
                self.unknown_since.remove(&cid);
                continue;
            }
            let removed = self.evidence.get(&cid).is_some_and(|e| e.removed.is_some());
            let since = *self.unknown_since.entry(cid.clone()).or_insert(now);
            if removed || now.duration_since(since) >= self.cfg.unknown_grace {
                // Known once and now gone, or never known: either way nothing more will come.
                if !removed && !self.cri_status.contains_key(&cid) {
                    bump(&self.stats.unknown_dropped);
                    tracing::debug!(
                        container = cid,
                        pod = uid,
                        "kernel reported a container the runtime never knew: dropped"
                    );
                }
                self.forget(&cid);
            } else {
                waiting = true;
            }
        }

        let Some(sandbox) = newest_sandbox(&snap.sandboxes) else {
            // The runtime has no such pod (any more).
            if self.view.write().expect("view lock").remove(uid).is_some() {
                self.generation.send_modify(|g| *g += 1);
            }
            for c in &snap.containers {
                self.cri_status.remove(&c.id);
            }
            return waiting;
        };
        let mut containers = Vec::with_capacity(snap.containers.len());
        let mut corrected = 0;
        for status in snap.containers {
            let cid = status.id.clone();
            let v = merge::merge(&cid, Some(&status), self.evidence.get(&cid), &self.clock);
            // The kernel saw the death first; the runtime's account (finished time, its reason)
            // follows within milliseconds. Ask again shortly rather than wait for the relist.
            let runtime_lags = self.evidence.get(&cid).is_some_and(|e| e.exit.is_some())
                && merge::cri_phase(status.state) != ContainerPhase::Exited;
            if runtime_lags {
                let since = *self.lagging_since.entry(cid.clone()).or_insert(now);
                waiting |= now.duration_since(since) < self.cfg.unknown_grace;
            } else {
                self.lagging_since.remove(&cid);
            }
            if v.runtime_reason.is_some() || v.runtime_exit_code.is_some() {
                corrected += 1;
            }
            self.pod_of.insert(cid.clone(), uid.to_string());
            self.cri_status.insert(cid, status);
            containers.push(v);
        }
        containers.sort_by(|a, b| {
            (&a.name, a.restart_count, a.created_at).cmp(&(&b.name, b.restart_count, b.created_at))
        });
        let meta = sandbox.metadata.clone().unwrap_or_default();
        let sandbox_died = self
            .evidence
            .get(&sandbox.id)
            .is_some_and(|e| e.exit.is_some());
        let pod = PodView {
            uid: uid.to_string(),
            namespace: sandbox
                .pod_namespace()
                .unwrap_or(&meta.namespace)
                .to_string(),
            name: sandbox.pod_name().unwrap_or(&meta.name).to_string(),
            sandbox_id: sandbox.id.clone(),
            sandbox_ready: sandbox.state == api::PodSandboxState::SandboxReady as i32
                && !sandbox_died,
            created_at: merge::cri_time(sandbox.created_at),
            last_oom: latest_oom(&containers),
            containers,
        };
        self.pod_of.insert(sandbox.id.clone(), uid.to_string());
        let mut view = self.view.write().expect("view lock");
        let old = view.insert(uid.to_string(), pod);
        let changed = old.as_ref() != view.get(uid);
        if changed {
            // Count each container whose account the kernel corrected once, when it first shows.
            let before = old.map_or(0, |o| {
                o.containers
                    .iter()
                    .filter(|c| c.runtime_reason.is_some() || c.runtime_exit_code.is_some())
                    .count()
            });
            self.stats.corrected.fetch_add(
                (corrected as u64).saturating_sub(before as u64),
                Ordering::Relaxed,
            );
        }
        drop(view);
        if changed {
            self.generation.send_modify(|g| *g += 1);
        }
        waiting
    }

    fn forget(&mut self, cid: &str) {
        self.evidence.remove(cid);
        self.pod_of.remove(cid);
        self.unknown_since.remove(cid);
        self.lagging_since.remove(cid);
        self.cri_status.remove(cid);
    }

    /// Lists everything, counts what the event-driven path missed, and fetches the pods that
    /// differ.
    async fn relist(&mut self) {
        let Ok(client) = self.cri.client() else {
            tracing::debug!("relist skipped: runtime not connected (it runs again on reconnect)");
            return;
        };
        let (sandboxes, containers) = match tokio::try_join!(
            client.list_pod_sandboxes(None),
            client.list_containers(None)
        ) {
            Ok(x) => x,
            Err(e) => {
                bump(&self.stats.fetch_errors);
                tracing::warn!("relist failed: {}", e.chain());
                return;
            }
        };
        let initial = !self.relisted_once;
        self.relisted_once = true;
        let mut by_pod: HashMap<String, Vec<&api::Container>> = HashMap::new();
        let mut pods: HashSet<String> = HashSet::new();
        for s in &sandboxes {
            if let Some(uid) = s.pod_uid() {
                pods.insert(uid.to_string());
            }
        }
        for c in &containers {
            if let Some(uid) = c.pod_uid() {
                pods.insert(uid.to_string());
                by_pod.entry(uid.to_string()).or_default().push(c);
            }
        }
        let mut to_fetch: Vec<String> = Vec::new();
        let mut missed = 0u64;
        let mut adopted = 0u64;
        {
            let view = self.view.read().expect("view lock");
            for uid in &pods {
                let pending = self
                    .work
                    .get(uid)
                    .is_some_and(|w| w.in_flight || w.dirty || w.retry_at.is_some());
                let Some(pv) = view.get(uid) else {
                    if !initial && !pending {
                        // Never heard of: the kernel missed its containers' cgroups, or they
                        // predate us without running processes.
                        adopted += 1;
                    }
                    to_fetch.push(uid.clone());
                    continue;
                };
                let listed = by_pod.get(uid).map(Vec::as_slice).unwrap_or_default();
                let mut differs = false;
                for c in listed {
                    let phase = merge::cri_phase(c.state);
                    match pv.containers.iter().find(|v| v.id == c.id) {
                        None => differs = true,
                        // The kernel saw the death before the runtime: not a miss.
                        Some(v)
                            if v.phase == ContainerPhase::Exited
                                && phase == ContainerPhase::Running => {}
                        Some(v) if v.phase != phase => differs = true,
                        Some(_) => {}
                    }
                }
                // Gone from the runtime. Not a miss when the kernel already reported its cgroup
                // removed: the runtime's own record is deleted later (kubelet's garbage
                // collection), and no kernel event can say when.
                for v in pv
                    .containers
                    .iter()
                    .filter(|v| !listed.iter().any(|c| c.id == v.id))
                {
                    let removed = self
                        .evidence
                        .get(&v.id)
                        .is_some_and(|e| e.removed.is_some());
                    if removed {
                        to_fetch.push(uid.clone());
                    } else {
                        differs = true;
                    }
                }
                if differs {
                    if !pending {
                        missed += 1;
                    }
                    to_fetch.push(uid.clone());
                }
            }
            for uid in view.keys().filter(|u| !pods.contains(*u)) {
                let pending = self.work.get(uid).is_some_and(|w| w.in_flight || w.dirty);
                if !pending {
                    missed += 1;
                }
                to_fetch.push(uid.clone());
            }
        }
        if missed > 0 {
            tracing::warn!(
                missed,
                "relist found pods whose changes no event had reported; repairing"
            );
        }
        self.stats
            .missed_events
            .fetch_add(missed, Ordering::Relaxed);
        self.stats.adopted.fetch_add(adopted, Ordering::Relaxed);
        // Pods with kernel evidence whose fetch failed while disconnected are fetched too.
        let stale: Vec<String> = self
            .work
            .iter()
            .filter(|(_, w)| !w.in_flight && (w.dirty || w.failures > 0))
            .map(|(u, _)| u.clone())
            .collect();
        for uid in to_fetch.into_iter().chain(stale) {
            self.schedule(&uid);
        }
        // Counted once its requests are out, so that `settled` cannot see a relist without them.
        bump(&self.stats.relists);
    }
}

fn newest_sandbox(s: &[api::PodSandbox]) -> Option<&api::PodSandbox> {
    s.iter().max_by_key(|s| {
        (
            s.state == api::PodSandboxState::SandboxReady as i32,
            s.created_at,
        )
    })
}

fn latest_oom(containers: &[ContainerView]) -> Option<OomEvidence> {
    containers
        .iter()
        .filter_map(|c| c.last_oom.clone())
        .max_by_key(|o| o.time)
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Where the runtime offers GetContainerEvents (containerd 1.7+, CRI-O), each of its events makes
/// the reconciler re-read that pod: it is how the removal of a dead container's record (kubelet's
/// garbage collection, invisible to the kernel) shows without waiting for the relist.
async fn follow_runtime_events(cri: ReconnectingCri, tx: tokio::sync::mpsc::Sender<String>) {
    let mut conn = cri.subscribe();
    loop {
        let _ = conn.wait_for(|s| s.connected).await;
        let generation = conn.borrow().generation;
        match cri.get_container_events().await {
            Ok(mut stream) => {
                tracing::info!("following the runtime's container events");
                while let Some(ev) = stream.next().await {
                    let Ok(ev) = ev else { break };
                    let uid = ev.pod_sandbox_status.as_ref().and_then(|s| {
                        s.pod_uid()
                            .map(str::to_string)
                            .or_else(|| s.metadata.as_ref().map(|m| m.uid.clone()))
                    });
                    if let Some(uid) = uid.filter(|u| !u.is_empty()) {
                        if tx.send(uid).await.is_err() {
                            return;
                        }
                    }
                }
            }
            Err(e) if e.is_unimplemented() => {
                tracing::info!("the runtime has no GetContainerEvents; removals of dead containers show at the relist");
            }
            Err(e) => tracing::debug!("GetContainerEvents: {}", e.chain()),
        }
        // Try again only on the next connection.
        if conn.wait_for(|s| s.generation != generation).await.is_err() {
            return;
        }
    }
}

async fn sleep_until(t: Option<Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// The pod's sandboxes and the full status of each of its containers.
async fn fetch_pod(cri: &ReconnectingCri, uid: &str) -> Result<PodSnapshot, CriError> {
    let client = cri.client()?;
    let selector: HashMap<String, String> = [(keys::POD_UID.to_string(), uid.to_string())].into();
    let sandbox_filter = api::PodSandboxFilter {
        label_selector: selector.clone(),
        ..Default::default()
    };
    let container_filter = api::ContainerFilter {
        label_selector: selector,
        ..Default::default()
    };
    let (sandboxes, containers) = tokio::try_join!(
        client.list_pod_sandboxes(Some(sandbox_filter)),
        client.list_containers(Some(container_filter))
    )?;
    let mut statuses = Vec::with_capacity(containers.len());
    for c in containers {
        match client.container_status(&c.id).await {
            Ok(s) => statuses.push(s),
            // Removed between the list and the status call: it is simply gone.
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    Ok(PodSnapshot {
        sandboxes,
        containers: statuses,
    })
}
