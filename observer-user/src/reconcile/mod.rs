//! Reconciliation: the kernel knows when and how a process died; the runtime knows which container
//! it was, its name and restart count; the kernel log remembers OOM kills from before the agent
//! ran. The [`Reconciler`] merges them into a [`NodeView`] ([`merge`] says who wins where) and
//! repairs what either side missed.
//!
//! - Each PLEG event updates the view at once from the kernel's evidence, then asks the runtime
//!   about the pod through a [`Runner`]: one request in flight per pod, a burst folded into one
//!   follow-up, a bounded number of pods at once, failures retried with jittered back-off.
//! - A container the kernel reported but the runtime does not know yet, or whose death the runtime
//!   has not caught up with, is asked about again shortly; after a grace period it is dropped
//!   (and counted) or left to the runtime's account.
//! - A full relist ([`relist::diff`]) runs at start, every `relist_period`, and at once after the
//!   kernel dropped records or the runtime connection came back. Every difference it has to
//!   repair is counted as a missed event: the aim is zero.
//! - The runtime's init pid (verbose status) is asked once per container: checked against the
//!   kernel's choice (a disagreement is counted and logged once), and used to tell whether a
//!   kernel-log kill took the init.
pub mod evidence;
mod fetch;
mod handle;
pub mod history;
pub mod inits;
mod kills;
mod memory;
pub mod merge;
mod metrics;
pub mod relist;
pub mod runtime;
mod runtime_events;
mod snapshot;
pub mod termination;
#[cfg(test)]
pub(crate) mod testkit;
pub mod view;

use std::{collections::HashMap, time::Duration};

use k8s_cri::v1 as api;
use tokio::{sync::mpsc, time::Instant};

pub use evidence::KernelEvidence;
use fetch::{fetch_pod, PodSnapshot};
use handle::{add, bump, Shared};
pub use handle::{ReconcileHandle, ReconcileStats};
pub(crate) use history::OomHistory;
pub(crate) use kills::{OomKillLabels, SCOPE_GRACE};
pub use runtime::RuntimeService;
use snapshot::{PodPlan, SandboxPlan};
use termination::TerminationMessage;
pub use view::OomEvidence;
pub use view::{ContainerPhase, ContainerView, OomScope, PodView, ScopeUnknown, Source};

use crate::{
    cri::{CriError, KubeletLabels, ReconnectingCri},
    kernel::{kmsg::LoggedOomKill, BootClock},
    model::{ContainerId, PodUid, SharedClock},
    pleg::{PlegReceiver, PodLifecycleEvent},
    runner::{Finished, Runner, RunnerConfig, Step},
    sync::AbortOnDrop,
};

#[derive(Clone, Debug)]
pub struct ReconcileConfig {
    /// Period of the safety relist.
    pub relist_period: Duration,
    /// How long a container the kernel reported may stay unknown to the runtime, or the runtime
    /// may lag behind a death the kernel reported, before the runtime's word is final.
    pub unknown_grace: Duration,
    /// Pods asked about at once.
    pub max_fetches: usize,
    /// Where the inits of containers are kept across agent restarts (see [`inits`]); `None`: in
    /// memory only.
    pub state_dir: Option<std::path::PathBuf>,
    /// Only the agent writes there; everything else reads.
    pub state_access: inits::StateAccess,
}

impl Default for ReconcileConfig {
    fn default() -> Self {
        Self {
            relist_period: Duration::from_secs(60),
            unknown_grace: Duration::from_secs(2),
            max_fetches: 8,
            state_dir: Some("/run/observer".into()),
            state_access: inits::StateAccess::ReadOnly,
        }
    }
}

/// How soon a pod is asked about again while the runtime lags behind the kernel.
const REQUERY: Duration = Duration::from_millis(100);

type PodFetch = Result<PodSnapshot, CriError>;

/// Everything known of one container or sandbox id.
struct Tracked {
    pod: PodUid,
    kernel: Option<KernelEvidence>,
    runtime: Option<api::ContainerStatus>,
    /// Its termination message from the node's files, read with the runtime's status.
    termination: Option<TerminationMessage>,
    /// The init's pid from the runtime's verbose status, once asked.
    runtime_pid: Option<u32>,
    pid_asked: bool,
    /// The runtime's init was checked against the kernel's (once both were known, in either
    /// order).
    init_checked: bool,
    /// Since when the kernel reported it and the runtime does not know it.
    unknown_since: Option<Instant>,
    /// Since when the runtime still calls running a container whose death the kernel reported.
    lagging_since: Option<Instant>,
    /// Memory pressure: as read at every limit hit, and as the view shows it (`reconcile::memory`).
    pressure: Option<memory::Tracked>,
}

impl Tracked {
    fn new(pod: PodUid) -> Self {
        Self {
            pod,
            kernel: None,
            runtime: None,
            termination: None,
            runtime_pid: None,
            pid_asked: false,
            init_checked: false,
            unknown_since: None,
            lagging_since: None,
            pressure: None,
        }
    }
}

/// The reconciler against a runtime: the CRI ([`ReconnectingCri`]) in the agent, a fake one in
/// its tests.
pub(crate) struct Reconciler<R: RuntimeService = ReconnectingCri> {
    cri: R,
    cfg: ReconcileConfig,
    clock: BootClock,
    shared: std::sync::Arc<Shared>,
    tracked: HashMap<ContainerId, Tracked>,
    fetches: Runner<PodUid, (), PodFetch>,
    pids: Runner<ContainerId, (), Result<Option<u32>, CriError>>,
    history: OomHistory,
    inits: inits::InitStore,
    kills: kills::KillCounter,
    /// Kills the kernel logs from now on (the OOM-ing cgroup, its limit).
    kmsg: Option<mpsc::Receiver<LoggedOomKill>>,
    relisted_once: bool,
    /// When the reconciler was made: the first sync's duration is said from here.
    started: tokio::time::Instant,
    /// The wall clock: a death's detection latency, a held kill's grace.
    wall: SharedClock,
    /// Where memory cgroups at their limit are read; `None`: limit hits are not judged.
    memory: Option<crate::pressure::MemoryReader>,
}

impl<R: RuntimeService> Reconciler<R> {
    /// `clock` maps kernel times to wall time; pass the pipeline's, which it keeps refreshed.
    /// `history`: the kernel log's kills (read after the probes were attached, so that together
    /// they miss none). `inits`: what earlier agents of this boot saw start.
    pub(crate) fn new(
        cri: R,
        cfg: ReconcileConfig,
        clock: BootClock,
        history: OomHistory,
        inits: inits::InitStore,
    ) -> (Self, ReconcileHandle) {
        let shared = std::sync::Arc::new(Shared::new());
        let runner_cfg = |max| RunnerConfig {
            max_concurrent: max,
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            seed: None,
        };
        let c = cri.clone();
        let fetches = Runner::new(runner_cfg(cfg.max_fetches), move |uid, ()| {
            let cri = c.clone();
            async move {
                match fetch_pod(&cri, uid).await {
                    Ok(s) => Step::done(Ok(s)),
                    // The last state must get through: retried until the runtime answers (a
                    // reconnect's relist also asks again).
                    Err(e) => Step::retry(Err(e)),
                }
            }
        });
        let c = cri.clone();
        let pids = Runner::new(runner_cfg(2), move |id: ContainerId, ()| {
            let cri = c.clone();
            async move {
                match cri.container_pid(id.as_str()).await {
                    Err(e) if !e.is_not_found() => Step::retry(Err(e)),
                    r => Step::done(r.or(Ok(None))),
                }
            }
        });
        let me = Self {
            kills: kills::KillCounter::new(shared.oom_kills.clone()),
            inits,
            cri,
            cfg,
            clock,
            shared: std::sync::Arc::clone(&shared),
            tracked: HashMap::new(),
            fetches,
            pids,
            history,
            kmsg: None,
            relisted_once: false,
            started: tokio::time::Instant::now(),
            wall: crate::model::system_clock(),
            memory: None,
        };
        (me, ReconcileHandle(shared))
    }

    /// Reads the wall clock from `clock` (the agent's; a fake one in tests).
    pub(crate) fn set_wall_clock(&mut self, clock: SharedClock) {
        self.wall = clock;
    }

    /// Judges the kernel's limit hits by reading the memory cgroups there (`crate::pressure`).
    pub(crate) fn set_memory_reader(&mut self, reader: Option<crate::pressure::MemoryReader>) {
        self.memory = reader.map(|r| r.counting_in(&self.shared.pressure));
    }

    /// The kernel log's kills so far: read once the probes are attached (so that together they
    /// miss none), before [`Self::run`].
    pub(crate) fn set_history(&mut self, history: OomHistory) {
        self.history = history;
    }

    /// Merges the kills the kernel logs from now on into the evidence (see [`crate::kernel::kmsg::Follower`]).
    pub(crate) fn follow_kernel_log(&mut self, kills: mpsc::Receiver<LoggedOomKill>) {
        self.kmsg = Some(kills);
    }

    /// Runs until the PLEG stream ends.
    pub(crate) async fn run(mut self, mut pleg: PlegReceiver) {
        let mut conn = self.cri.connection();
        let mut seen_generation = conn.borrow().generation;
        let mut tick = tokio::time::interval(self.cfg.relist_period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Proves the loop turns when nothing happens (the agent's health check reads it).
        let mut heartbeat = tokio::time::interval(handle::HEARTBEAT);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let shared = std::sync::Arc::clone(&self.shared);
        let (runtime_tx, mut runtime_events) = mpsc::channel(1024);
        let _follower = AbortOnDrop(tokio::spawn(runtime_events::follow(
            self.cri.clone(),
            runtime_tx,
        )));
        loop {
            tokio::select! {
                ev = pleg.recv() => match ev {
                    Some(ev) => self.on_pleg(ev),
                    None => return,
                },
                done = self.fetches.next() => self.on_fetched(done),
                done = self.pids.next() => self.on_pid(done),
                _ = tick.tick() => self.relist().await,
                _ = shared.relist.notified() => self.relist().await,
                Ok(()) = conn.changed() => {
                    let state = conn.borrow_and_update().clone();
                    if state.connected && state.generation != seen_generation {
                        seen_generation = state.generation;
                        tracing::info!(reconnects = state.reconnects(), "CRI connection (re)established: relisting");
                        // What failed while the runtime was away is asked again now.
                        self.fetches.expedite();
                        self.relist().await;
                    }
                }
                Some(uid) = runtime_events.recv() => self.fetch(uid),
                Some(kill) = recv_opt(&mut self.kmsg) => self.on_logged_kill(kill),
                () = held_kills(&self.kills, &*self.wall) => self.count_held(),
                _ = heartbeat.tick() => self.recheck_pressure(),
            }
            self.shared.beat();
            // Every pod asked about has been answered (a pod whose fetch waits out a back-off
            // is not answered yet).
            // Once: the first sync stays done while later requests are in flight.
            if self.relisted_once && self.fetches.is_idle() && !*self.shared.settled.borrow() {
                tracing::info!(
                    pods = self.shared.view().len(),
                    elapsed = ?self.started.elapsed(),
                    "the first sync with the runtime is done"
                );
                self.shared.settled.send_replace(true);
            }
        }
    }

    fn on_pleg(&mut self, ev: PodLifecycleEvent) {
        bump(&self.shared.stats.pleg_events);
        if let Some(exit) = ev.exit() {
            if exit.status.is_some() {
                let after = self
                    .wall
                    .now()
                    .duration_since(self.clock.to_system_time(ev.at))
                    .unwrap_or_default();
                self.shared.detection_latency.observe(after);
            }
        }
        let _ = self.shared.pleg.send(ev.clone());
        let uid = ev.pod_uid;
        if let crate::pleg::PlegEvent::ContainerStarted { id, pid, .. } = ev.event {
            self.inits.record(id, pid);
        }
        if let crate::pleg::PlegEvent::OomKill { id, kill, .. } = &ev.event {
            // The log's report may have come first, from a memory cgroup above the container.
            let clock = &self.clock;
            self.history.place(*id, |k| {
                merge::same_kill(kill.victim.tgid, kill.marked_at, k, clock)
            });
        }
        if let crate::pleg::PlegEvent::LimitHit { id, hit, cgroup } = &ev.event {
            // Judged here, not fetched: the runtime's account does not change with it.
            self.on_limit_hit(uid, *id, hit, cgroup);
            return;
        }
        if let Some(cid) = ev.container_id() {
            let t = self.tracked.entry(cid).or_insert_with(|| Tracked::new(uid));
            if t.kernel
                .get_or_insert_with(KernelEvidence::default)
                .apply(&ev)
            {
                self.remerge(uid, cid);
            }
            // The runtime may have answered before the kernel's start was read.
            self.check_init(cid);
        }
        self.fetch(uid);
    }

    fn on_logged_kill(&mut self, kill: LoggedOomKill) {
        // By the victim's memory cgroup; where that names no container (on cgroup v2, a memory
        // cgroup above the container's when the controller is not on below it), by the probes'
        // own record of the same victim (they saw the kill first: the log's report is read once
        // it is whole).
        let probes = self.tracked.iter().find_map(|(id, t)| {
            t.kernel
                .as_ref()?
                .oom_victims
                .iter()
                .any(|&(pid, at)| merge::same_kill(pid, at, &kill, &self.clock))
                .then_some(*id)
        });
        let logged = self.history.container_of(&kill);
        // The probes read the victim's cgroup from the kernel itself: a report of the same kill
        // that names another container (the victim moved between its choice and the report) is
        // not believed, rather than given to either.
        if let (Some(p), Some(l)) = (probes, logged) {
            if p != l {
                tracing::debug!(pid = kill.pid, probes = %p, log = %l, "the kernel log's report names another container than the probes saw: not believed");
                return;
            }
        }
        let id = probes.or(logged);
        let Some(id) = id else {
            self.history.unplaced(kill);
            return;
        };
        self.history.add_to(id, kill);
        if let Some(uid) = self.tracked.get(&id).map(|t| t.pod) {
            self.remerge(uid, id);
        }
    }

    fn fetch(&mut self, uid: PodUid) {
        bump(&self.shared.stats.pod_fetches);
        self.fetches.schedule(uid, ());
    }

    /// Re-merges one container (or the sandbox's readiness) from what is stored, so the view
    /// shows a death the moment the kernel reports it.
    fn remerge(&mut self, uid: PodUid, cid: ContainerId) {
        let Some(t) = self.tracked.get(&cid) else {
            return;
        };
        let merged = (!self.is_sandbox(uid, cid)).then(|| self.merged(cid, t));
        let sandbox_dead = t.kernel.as_ref().is_some_and(|k| k.exit.is_some());
        let mut view = self.shared.view_mut();
        let Some(pod) = view.get_mut(&uid) else {
            return;
        };
        match merged {
            None if sandbox_dead => pod.sandbox_ready = false,
            None => return,
            Some(v) => {
                let Some(slot) = pod.containers.iter_mut().find(|c| c.id == cid) else {
                    return;
                };
                *slot = v;
                pod.last_oom = latest_oom(&pod.containers);
            }
        }
        drop(view);
        self.changed(uid);
    }

    /// Kills whose report did not come within the grace: counted now, scope unknown, though the
    /// view did not change.
    fn count_held(&mut self) {
        let now = self.wall.now();
        for uid in self.kills.held_due(now) {
            self.kills.update_at(uid, self.shared.view().get(&uid), now);
        }
    }

    /// The pod's view changed: counted, and handed to the consumer.
    fn changed(&mut self, uid: PodUid) {
        self.kills
            .update_at(uid, self.shared.view().get(&uid), self.wall.now());
        self.shared.changed(uid);
    }

    fn is_sandbox(&self, uid: PodUid, cid: ContainerId) -> bool {
        self.shared
            .view()
            .get(&uid)
            .is_some_and(|p| p.sandbox_id == cid)
    }

    fn merged(&self, id: ContainerId, t: &Tracked) -> ContainerView {
        merge::merge(
            merge::Inputs {
                id,
                runtime: t.runtime.as_ref(),
                termination: t.termination.as_ref(),
                // The runtime's word, else what an earlier agent of this boot saw start.
                runtime_pid: t.runtime_pid.or_else(|| self.inits.get(&id)),
                kernel: t.kernel.as_ref(),
                logged: self.history.kills_of(&id),
                log_since: self.history.since(),
            },
            &self.clock,
        )
        .with_memory(t.pressure.as_ref().and_then(|p| p.shown.clone()))
    }

    fn on_fetched(&mut self, done: Finished<PodUid, PodFetch>) {
        let uid = done.key;
        match done.output {
            Ok(Ok(snapshot)) => {
                if self.apply_snapshot(uid, snapshot) {
                    self.fetches.schedule_in(uid, (), REQUERY);
                }
            }
            Ok(Err(e)) => {
                bump(&self.shared.stats.fetch_errors);
                // Not connected (yet, or any more) is the connection's to report, once.
                if done.failures == 1 && !matches!(e, CriError::Disconnected { .. }) {
                    tracing::warn!(pod = %uid, "runtime status of pod failed (retrying): {}", e.chain());
                }
            }
            Err(panicked) => {
                bump(&self.shared.stats.fetch_errors);
                tracing::error!(pod = %uid, "pod fetch {panicked} (retrying)");
            }
        }
    }

    fn on_pid(&mut self, done: Finished<ContainerId, Result<Option<u32>, CriError>>) {
        let id = done.key;
        let pid = match done.output {
            Ok(Ok(pid)) => pid,
            Ok(Err(e)) => {
                if done.failures == 1 {
                    tracing::debug!(container = %id, "verbose status failed (retrying): {}", e.chain());
                }
                return;
            }
            Err(panicked) => {
                tracing::error!(container = %id, "pid fetch {panicked}");
                return;
            }
        };
        let Some(t) = self.tracked.get_mut(&id) else {
            return;
        };
        t.runtime_pid = pid;
        let uid = t.pod;
        self.check_init(id);
        self.remerge(uid, id);
    }

    /// The runtime's init against the kernel's, once both are known, whichever came first.
    fn check_init(&mut self, id: ContainerId) {
        let Some(t) = self.tracked.get_mut(&id).filter(|t| !t.init_checked) else {
            return;
        };
        let kernel_init = t.kernel.as_ref().and_then(|k| k.started.map(|(_, p, _)| p));
        let (Some(runtime), Some(kernel)) = (t.runtime_pid, kernel_init) else {
            return;
        };
        t.init_checked = true;
        bump(&self.shared.stats.init_checks);
        if runtime != kernel {
            let n = self
                .shared
                .stats
                .init_disagreements
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if n == 0 {
                tracing::warn!(container = %id, runtime, kernel, "the runtime names another init than the kernel saw (logged once, counted)");
            }
        }
    }

    /// Whether a running container's init is still to be checked against the runtime's (the
    /// dead ones that need it come with their pod's snapshot).
    fn wants_pid(&self, t: &Tracked, status: &api::ContainerStatus) -> bool {
        !t.pid_asked && merge::cri_phase(status.state) == ContainerPhase::Running
    }

    /// Carries out what the pod's snapshot says ([`snapshot::plan`]). Returns true when the
    /// runtime should be asked again shortly (a container the kernel reported is unknown to it, or
    /// it lags behind a death).
    fn apply_snapshot(&mut self, uid: PodUid, snap: PodSnapshot) -> bool {
        let plan = snapshot::plan(
            uid,
            snap,
            &self.tracked,
            Instant::now(),
            self.cfg.unknown_grace,
        );
        for id in &plan.unparsable {
            self.unparsable(id);
        }
        for (id, since) in &plan.unknown {
            if let Some(t) = self.tracked.get_mut(id) {
                t.unknown_since = Some(*since);
            }
        }
        for (id, never_known) in &plan.forget {
            if *never_known {
                bump(&self.shared.stats.unknown_dropped);
                tracing::debug!(container = %id, pod = %uid, "kernel reported a container the runtime never knew: dropped");
            }
            self.forget(id);
        }
        match plan.sandbox {
            SandboxPlan::Unparsable => {}
            SandboxPlan::Gone => {
                let gone = self.shared.view_mut().remove(&uid);
                if let Some(pod) = gone {
                    let names: Vec<String> =
                        pod.containers.iter().map(|c| c.name.clone()).collect();
                    self.shared
                        .pressure
                        .forget_pod(&pod.namespace, &pod.name, &names);
                    self.changed(uid);
                }
            }
            SandboxPlan::Present(pod) => self.apply_pod(uid, *pod),
        }
        plan.again
    }

    /// The pod's merged view, from its planned containers.
    fn apply_pod(&mut self, uid: PodUid, plan: PodPlan) {
        let PodPlan {
            sandbox,
            sandbox_id,
            containers: planned,
        } = plan;
        let mut containers = Vec::with_capacity(planned.len());
        let mut want_pids = Vec::new();
        for c in planned {
            let id = c.id;
            let t = self.tracked.entry(id).or_insert_with(|| Tracked::new(uid));
            t.pod = uid;
            t.unknown_since = None;
            t.lagging_since = c.lagging_since;
            if let Some(pid) = c.pid {
                t.runtime_pid = Some(pid);
                t.pid_asked = true;
            }
            t.runtime = Some(c.status);
            t.termination = c.termination;
            let t = &self.tracked[&id];
            if self.wants_pid(t, t.runtime.as_ref().expect("just set")) {
                want_pids.push(id);
            }
            containers.push(self.merged(id, t));
        }
        for id in want_pids {
            if let Some(t) = self.tracked.get_mut(&id) {
                t.pid_asked = true;
            }
            self.pids.schedule(id, ());
        }
        containers.sort_by(|a, b| {
            (&a.name, a.restart_count, a.created_at).cmp(&(&b.name, b.restart_count, b.created_at))
        });
        let corrected = containers
            .iter()
            .filter(|c| c.runtime_reason.is_some() || c.runtime_exit_code.is_some())
            .count();
        let meta = sandbox.metadata.clone().unwrap_or_default();
        let sandbox_died = self
            .tracked
            .get(&sandbox_id)
            .and_then(|t| t.kernel.as_ref())
            .is_some_and(|k| k.exit.is_some());
        self.tracked
            .entry(sandbox_id)
            .or_insert_with(|| Tracked::new(uid));
        let pod = PodView {
            uid,
            namespace: sandbox
                .pod_namespace()
                .unwrap_or(&meta.namespace)
                .to_string(),
            name: sandbox.pod_name().unwrap_or(&meta.name).to_string(),
            sandbox_id,
            sandbox_ready: sandbox.state == api::PodSandboxState::SandboxReady as i32
                && !sandbox_died,
            created_at: merge::cri_time(sandbox.created_at),
            last_oom: latest_oom(&containers),
            containers,
        };
        let mut view = self.shared.view_mut();
        let old = view.insert(uid, pod);
        let changed = old.as_ref() != view.get(&uid);
        drop(view);
        if changed {
            // Each container whose account was corrected counts once, when it first shows.
            let before = old.map_or(0, |o| {
                o.containers
                    .iter()
                    .filter(|c| c.runtime_reason.is_some() || c.runtime_exit_code.is_some())
                    .count()
            });
            add(
                &self.shared.stats.corrected,
                (corrected as u64).saturating_sub(before as u64),
            );
            self.changed(uid);
        }
    }

    fn unparsable(&self, id: &str) {
        let n = self
            .shared
            .stats
            .unparsable
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if n == 0 {
            tracing::warn!(
                id,
                "the runtime reported an id of no known shape: skipped (logged once, counted)"
            );
        }
    }

    fn forget(&mut self, id: &ContainerId) {
        self.tracked.remove(id);
        self.pids.forget(id);
        self.history.forget(id);
    }

    /// Lists everything, counts what the event-driven path missed, and fetches the pods that
    /// differ.
    async fn relist(&mut self) {
        let (sandboxes, containers) = match tokio::try_join!(
            self.cri.list_pod_sandboxes(None),
            self.cri.list_containers(None)
        ) {
            Ok(x) => x,
            Err(CriError::Disconnected { .. }) => {
                tracing::debug!(
                    "relist skipped: runtime not connected (it runs again on reconnect)"
                );
                return;
            }
            Err(e) => {
                bump(&self.shared.stats.fetch_errors);
                tracing::warn!("relist failed: {}", e.chain());
                return;
            }
        };
        let initial = !self.relisted_once;
        self.relisted_once = true;
        let listed: std::collections::HashSet<&str> = containers
            .iter()
            .map(|c| c.id.as_str())
            .chain(sandboxes.iter().map(|s| s.id.as_str()))
            .collect();
        self.inits.retain(|id| listed.contains(id.as_str()));
        let tracked = &self.tracked;
        self.history
            .retain(|id| listed.contains(id.as_str()) || tracked.contains_key(id));
        let fetches = &self.fetches;
        let d = {
            let view = self.shared.view();
            relist::diff(
                &view,
                &sandboxes,
                &containers,
                &relist::RelistContext {
                    initial,
                    pending: &|uid| fetches.is_busy(uid),
                    removed: &|id| {
                        tracked
                            .get(id)
                            .and_then(|t| t.kernel.as_ref())
                            .is_some_and(|k| k.removed.is_some())
                    },
                },
            )
        };
        tracing::debug!(
            sandboxes = sandboxes.len(),
            containers = containers.len(),
            fetch = d.fetch.len(),
            missed = d.missed,
            "relist"
        );
        if d.missed > 0 {
            tracing::warn!(
                missed = d.missed,
                "relist found pods whose changes no event had reported; repairing"
            );
        }
        let stats = &self.shared.stats;
        add(&stats.missed_events, d.missed);
        add(&stats.adopted, d.adopted);
        add(&stats.unparsable, d.unparsable);
        for uid in d.fetch {
            self.fetch(uid);
        }
        // Counted once its requests are scheduled, so that `settled` cannot see a relist without them.
        bump(&self.shared.stats.relists);
    }
}

fn latest_oom(containers: &[ContainerView]) -> Option<OomEvidence> {
    containers
        .iter()
        .filter_map(|c| c.last_oom.clone())
        .max_by_key(|o| o.time)
}

async fn recv_opt<T>(rx: &mut Option<mpsc::Receiver<T>>) -> Option<T> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Until the grace of the first kill held for its report ends (never, with none held).
async fn held_kills(kills: &kills::KillCounter, wall: &dyn crate::model::Clock) {
    match kills.next_held() {
        Some(at) => {
            let left = at.duration_since(wall.now()).unwrap_or_default();
            // A millisecond more: the grace has surely ended when the counter looks.
            tokio::time::sleep(left + Duration::from_millis(1)).await;
        }
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests;
