//! The fast path of `observer run` (`conditions` mode): a container's death from the PLEG to the
//! `ContainersAlive=False` PATCH on the wire, without waiting for the reconciler, the status
//! manager or the CRI, and all on the kernel reader's thread (real-time with
//! `--realtime-priority`: see [`crate::sched`] for the bound), so that the request waits neither
//! behind the node's workloads nor for another thread's wake-up.
//!
//! - [`FastDeaths`] is the PLEG's hook. For each death (the kernel saw the init exit, with its
//!   status) it takes the pod's [`Basis`] from the ledger (the reconciled view and the API's pod
//!   as the status manager last computed them: the container's name and restart count are known
//!   from its start) and claims the transition. A failed death's patch was made there ahead
//!   ([`Prepared`]): only how and when the container ended are spliced in. Any other death (an
//!   exit 0) is applied to the view as the reconciler will, and the condition computed with the
//!   manager's own function ([`observer_conditions`]). It takes no lock a normal-priority thread
//!   holds for longer than a map operation (not the reconciler's view, not the reflector's
//!   store).
//! - The patch goes out from a task on the reader thread's own current-thread runtime
//!   ([`crate::pleg::FastPath::wants_runtime`]), with a client of its own (one kept-alive
//!   connection, none of kube's client layers: [`super::transport`]): it runs as soon as the
//!   batch is done, before the batch's bookkeeping. Only a transition to False is written
//!   here; every request runs in a task of its own with the request timeout, at most
//!   [`MAX_IN_FLIGHT`] at once, so a hung API server never holds up the next death or the
//!   reader.
//! - One owner of the condition's truth: the [`AliveLedger`], shared with the status manager,
//!   holds the last `ContainersAlive` either side submitted per pod. The fast path claims the
//!   False transition there (and skips when the ledger already says False); the manager does not
//!   write the pod while its view has not caught up with a claimed death (which would write True
//!   again), then takes the claim's transition time as its own, and counts a confirmed fast write
//!   as what the API has (so the same condition is not sent twice). Transitions back to True are
//!   the manager's alone.
use std::{
    collections::HashMap,
    ffi::OsString,
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex, OnceLock,
    },
    time::{Duration, SystemTime},
};

use ::kube::api::PatchParams;
use k8s_openapi::api::core::v1::PodCondition;

use k8s_openapi::api::core::v1::Pod;

use super::{
    conditions::{observer_conditions, ConditionTypes},
    patch::conditions_patch,
    transport::Transport,
    writer::{send_patch, WriteOutcome},
};
use crate::{
    cgroup::{ContainerId, PodUid},
    kernel::{BootClock, BootNs},
    pleg::{ContainerExit, FastPath, PlegEvent, PodLifecycleEvent},
    reconcile::{ContainerPhase, PodView, ReconcileHandle, Source},
};

/// Requests in flight at once; beyond, deaths are left to the status manager.
pub const MAX_IN_FLIGHT: usize = 1024;

/// How often the writer's idle connection is used (`GET /version`), so that it stays open.
const KEEPALIVE: Duration = Duration::from_secs(30);
/// How often the first request is tried while the API does not answer.
const RETRY: Duration = Duration::from_secs(1);

/// One death, as the PLEG sent it.
#[derive(Clone, Debug)]
pub struct Death {
    pub pod: PodUid,
    pub container: ContainerId,
    pub at: BootNs,
    pub exit: ContainerExit,
}

/// Counters of the fast path.
#[derive(Debug, Default)]
pub struct FastStats {
    /// Deaths seen, and those left to the manager because too many requests were in flight.
    pub deaths: AtomicU64,
    pub dropped: AtomicU64,
    /// Deaths left to the normal path: the pod or container not known yet, not a transition,
    /// the view already had it.
    pub skipped: AtomicU64,
    /// Patches accepted by the API, and those that were not (the normal path writes them).
    pub written: AtomicU64,
    pub failed: AtomicU64,
}

impl FastStats {
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

mod prepared;
pub use prepared::Prepared;

/// A death's patch, decided on the PLEG's thread.
pub struct FastJob {
    pub death: Death,
    pub patch: FastPatch,
}

/// The status patch of one death, encoded.
pub struct FastPatch {
    pub namespace: String,
    pub name: String,
    pub body: Vec<u8>,
}

/// What the PLEG's thread needs to decide a death's patch.
pub struct Decider {
    pub types: ConditionTypes,
    pub ledger: Arc<AliveLedger>,
    pub stats: Arc<FastStats>,
}

/// What the fast path's requests need, known before the agent starts.
pub struct WriterConfig {
    pub kubeconfig: Option<OsString>,
    pub field_manager: String,
    pub request_timeout: Duration,
    /// Set once the agent has its reconciler: a pod whose patch was answered is marked changed
    /// there, for the status manager's turn.
    pub reconcile: Arc<OnceLock<ReconcileHandle>>,
    /// Observes the seconds from the kernel's exit to the patch handed to the HTTP client.
    pub latency: Option<prometheus_client::metrics::histogram::Histogram>,
}

struct Writer {
    cfg: WriterConfig,
    params: PatchParams,
    ledger: Arc<AliveLedger>,
    stats: Arc<FastStats>,
    clock: BootClock,
    /// Set when the first request through it was answered.
    client: OnceLock<Transport>,
    in_flight: AtomicUsize,
    panicked: Mutex<Option<String>>,
}

/// The fast path, on the PLEG's thread: every death with a known exit decided, claimed, and
/// its patch sent from a task on that thread's runtime.
pub struct FastDeaths {
    decider: Decider,
    clock: BootClock,
    writer: Arc<Writer>,
}

impl FastDeaths {
    pub fn new(decider: Decider, clock: BootClock, cfg: WriterConfig) -> Self {
        let writer = Arc::new(Writer {
            params: PatchParams {
                field_manager: Some(cfg.field_manager.clone()),
                ..Default::default()
            },
            cfg,
            ledger: Arc::clone(&decider.ledger),
            stats: Arc::clone(&decider.stats),
            clock: clock.clone(),
            client: OnceLock::new(),
            in_flight: AtomicUsize::new(0),
            panicked: Mutex::new(None),
        });
        Self {
            decider,
            clock,
            writer,
        }
    }

    /// The patch for `ev` when it is a death the fast path is to write, claimed in the ledger.
    pub fn claim(&mut self, ev: &PodLifecycleEvent) -> Option<FastJob> {
        let PlegEvent::ContainerDied { id, exit } = &ev.event else {
            return None;
        };
        exit.status?;
        let d = &self.decider;
        bump(&d.stats.deaths);
        // Nothing is claimed while no request can be sent: the manager writes every death then.
        if !d.ledger.writer.load(Ordering::Acquire) {
            bump(&d.stats.skipped);
            return None;
        }
        // A hung API server holds at most this many requests: beyond, the manager writes.
        if self.writer.in_flight.load(Ordering::Relaxed) >= MAX_IN_FLIGHT {
            bump(&d.stats.dropped);
            return None;
        }
        let death = Death {
            pod: ev.pod_uid,
            container: *id,
            at: ev.at,
            exit: exit.clone(),
        };
        let Some(patch) = decide(d, &death, &self.clock) else {
            bump(&d.stats.skipped);
            return None;
        };
        Some(FastJob { death, patch })
    }
}

impl FastPath for FastDeaths {
    fn wants_runtime(&self) -> bool {
        true
    }

    fn start(&mut self) {
        tokio::spawn(Arc::clone(&self.writer).connect());
    }

    fn failed(&mut self) -> Option<String> {
        crate::sync::lock(&self.writer.panicked).take()
    }

    fn event(&mut self, ev: &PodLifecycleEvent, _sent: SystemTime) {
        let Some(FastJob { death, patch }) = self.claim(ev) else {
            return;
        };
        let w = Arc::clone(&self.writer);
        let Some(client) = w.client.get().cloned() else {
            w.ledger.fail(&death.pod, death.container);
            return;
        };
        w.in_flight.fetch_add(1, Ordering::Relaxed);
        // A task per request, on this thread's runtime: it runs as soon as the batch is done,
        // and one that hangs never holds up the next death.
        tokio::spawn(async move {
            use futures::FutureExt;
            let sent = std::panic::AssertUnwindSafe(w.write(&client, &death, patch))
                .catch_unwind()
                .await;
            w.in_flight.fetch_sub(1, Ordering::Relaxed);
            if let Err(panic) = sent {
                w.ledger.fail(&death.pod, death.container);
                *crate::sync::lock(&w.panicked) = Some(crate::runner::panic_message(panic));
            }
        });
    }
}

/// A death the fast path claimed: its False transition is the fast path's to write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    pub container: ContainerId,
    /// The API accepted the fast path's patch.
    pub confirmed: bool,
    /// The fast path's patch was not accepted (an error, a timeout): the manager writes it.
    pub failed: bool,
}

#[derive(Clone, Debug, Default)]
struct Entry {
    /// `ContainersAlive` as last submitted by either side.
    alive: Option<PodCondition>,
    claim: Option<Claim>,
    basis: Option<Arc<Basis>>,
}

/// What a death's patch is computed from: the pod's reconciled view and its API object as the
/// status manager last computed the pod (set at each of its turns), so that the PLEG's thread
/// never waits for the reconciler's or the reflector's locks; and each running container's
/// failed death, made ahead from them.
#[derive(Debug)]
pub struct Basis {
    pub view: PodView,
    pub pod: Arc<Pod>,
    pub prepared: Vec<Prepared>,
}

/// The last `ContainersAlive` submitted per pod, the fast path's claims, and each pod's
/// [`Basis`]. Its lock is held for map operations only, by either side.
#[derive(Debug, Default)]
pub struct AliveLedger {
    pods: Mutex<HashMap<PodUid, Entry>>,
    /// The fast path has its client (the API answered it): claims can be answered.
    writer: std::sync::atomic::AtomicBool,
}

/// What the manager is to do with a pod, from the ledger.
#[derive(Clone, Debug, PartialEq)]
pub enum ManagerTurn {
    /// No claim: as without a fast path (`alive`: the last submitted, for its transition time).
    Free { alive: Option<PodCondition> },
    /// The fast path claimed a death the view does not show yet: writing now would say True.
    Wait,
    /// The view shows the claimed death and the fast path's patch is still in flight: writing
    /// now would send the same condition twice. The fast path marks the pod changed when its
    /// patch is answered, and the manager takes its turn then.
    InFlight,
    /// The view caught up with the claimed death: `alive` is what the fast path wrote (its
    /// transition time to keep), `confirmed` whether the API has it.
    Take {
        alive: PodCondition,
        confirmed: bool,
    },
}

impl AliveLedger {
    /// The fast path: claims the transition to `alive` (False) for `container`'s death, unless
    /// the ledger already says False or another death is claimed. `decide` gets the last
    /// submitted condition and returns the False condition to write, or `None`.
    pub fn claim(
        &self,
        pod: PodUid,
        container: ContainerId,
        decide: impl FnOnce(Option<&PodCondition>) -> Option<PodCondition>,
    ) -> Option<(Option<PodCondition>, PodCondition)> {
        let mut map = crate::sync::lock(&self.pods);
        let e = map.entry(pod).or_default();
        if e.claim.is_some() || e.alive.as_ref().is_some_and(|a| a.status == "False") {
            return None;
        }
        let alive = decide(e.alive.as_ref())?;
        let before = e.alive.replace(alive.clone());
        e.claim = Some(Claim {
            container,
            confirmed: false,
            failed: false,
        });
        Some((before, alive))
    }

    /// The manager's turn on a pod: what the next death's patch starts from, and the patches
    /// of its running containers' failed deaths (none while the pod is not alive: no death is a
    /// transition then).
    pub fn prepare(&self, pod: PodUid, view: &PodView, api: &Arc<Pod>, types: &ConditionTypes) {
        let not_alive = crate::sync::lock(&self.pods)
            .get(&pod)
            .and_then(|e| e.alive.as_ref())
            .is_some_and(|a| a.status == "False");
        let prepared = match api.metadata.uid.as_deref() {
            Some(uid) if !not_alive => view
                .current()
                .filter(|c| c.phase == ContainerPhase::Running)
                .filter_map(|c| Prepared::new(types, api.spec.as_ref(), view, uid, c.id))
                .collect(),
            _ => Vec::new(),
        };
        let basis = Arc::new(Basis {
            view: view.clone(),
            pod: Arc::clone(api),
            prepared,
        });
        crate::sync::lock(&self.pods).entry(pod).or_default().basis = Some(basis);
    }

    /// The fast path has its client: only then are claims made.
    pub fn writer_running(&self, on: bool) {
        self.writer.store(on, Ordering::Release);
    }

    fn basis(&self, pod: &PodUid) -> Option<Arc<Basis>> {
        crate::sync::lock(&self.pods)
            .get(pod)
            .and_then(|e| e.basis.clone())
    }

    /// The fast path's patch for `container` was accepted.
    pub fn confirm(&self, pod: &PodUid, container: ContainerId) {
        if let Some(c) = crate::sync::lock(&self.pods)
            .get_mut(pod)
            .and_then(|e| e.claim.as_mut())
            .filter(|c| c.container == container)
        {
            c.confirmed = true;
        }
    }

    /// The fast path's patch for `container` was not accepted: the manager is to write it.
    pub fn fail(&self, pod: &PodUid, container: ContainerId) {
        if let Some(c) = crate::sync::lock(&self.pods)
            .get_mut(pod)
            .and_then(|e| e.claim.as_mut())
            .filter(|c| c.container == container)
        {
            c.failed = true;
        }
    }

    /// The manager, before computing a pod: `caught_up` says whether the view shows a container's
    /// death (or no longer has it).
    pub fn manager_turn(
        &self,
        pod: &PodUid,
        caught_up: impl Fn(ContainerId) -> bool,
    ) -> ManagerTurn {
        let map = crate::sync::lock(&self.pods);
        let Some(e) = map.get(pod) else {
            return ManagerTurn::Free { alive: None };
        };
        match (&e.claim, &e.alive) {
            (Some(c), Some(_)) if caught_up(c.container) && !c.confirmed && !c.failed => {
                ManagerTurn::InFlight
            }
            (Some(c), Some(alive)) if caught_up(c.container) => ManagerTurn::Take {
                alive: alive.clone(),
                confirmed: c.confirmed,
            },
            (Some(_), _) => ManagerTurn::Wait,
            (None, alive) => ManagerTurn::Free {
                alive: alive.clone(),
            },
        }
    }

    /// The manager submitted (or found the API holding) `alive`: the claim, if any, is settled.
    pub fn record(&self, pod: PodUid, alive: PodCondition) {
        let mut map = crate::sync::lock(&self.pods);
        let e = map.entry(pod).or_default();
        e.alive = Some(alive);
        e.claim = None;
    }

    pub fn forget(&self, pod: &PodUid) {
        crate::sync::lock(&self.pods).remove(pod);
    }

    pub fn len(&self) -> usize {
        crate::sync::lock(&self.pods).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Whether `view` shows `container`'s death (or no longer has the container).
pub fn caught_up(view: &PodView, container: ContainerId) -> bool {
    view.containers
        .iter()
        .find(|c| c.id == container)
        .is_none_or(|c| !matches!(c.phase, ContainerPhase::Running | ContainerPhase::Created))
}

/// The view as the reconciler will have it once it applied the kernel's exit (merge rules: the
/// kernel's exit wins). `None` when the view does not know the container. The reconciler may
/// have applied it already (it reads the same event): the ledger, not the view, says whether
/// the transition is still to be written.
pub fn with_death(view: &PodView, d: &Death, clock: &BootClock) -> Option<PodView> {
    let status = d.exit.status?;
    let mut v = view.clone();
    let c = v.containers.iter_mut().find(|c| c.id == d.container)?;
    c.phase = ContainerPhase::Exited;
    c.exit_code = Some(status.exit_code());
    c.signal = status.signal();
    c.reason = Some(d.exit.reason.as_str().to_string());
    c.finished_at = Some(clock.to_system_time(d.at));
    c.exit_source = Some(Source::Kernel);
    Some(v)
}

/// The patch for a death, when it is a transition to False the fast path claimed.
fn decide(cfg: &Decider, d: &Death, clock: &BootClock) -> Option<FastPatch> {
    decide_at(cfg, d, clock, SystemTime::now())
}

fn decide_at(cfg: &Decider, d: &Death, clock: &BootClock, now: SystemTime) -> Option<FastPatch> {
    let basis = cfg.ledger.basis(&d.pod)?;
    let (view, pod) = (&basis.view, &basis.pod);
    let api_alive = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == cfg.types.alive));
    let made = Prepared::fits(d)
        .then(|| basis.prepared.iter().find(|p| p.container == d.container))
        .flatten();
    let body = match made {
        // Made ahead: the death's words and time spliced in.
        Some(p) => {
            let filled = p.fill(&cfg.types, d, clock, now)?;
            cfg.ledger.claim(d.pod, d.container, |last| {
                let known = last.or(api_alive);
                known
                    .is_none_or(|k| k.status != "False")
                    .then_some(filled.alive)
            })?;
            filled.body
        }
        None => decide_in_full(cfg, d, clock, view, pod, api_alive, now)?,
    };
    Some(FastPatch {
        namespace: view.namespace.clone(),
        name: view.name.clone(),
        body,
    })
}

/// [`decide`] for a death no patch was made for: the condition computed as the status manager
/// would, the patch against the last submitted condition.
fn decide_in_full(
    cfg: &Decider,
    d: &Death,
    clock: &BootClock,
    view: &PodView,
    pod: &Pod,
    api_alive: Option<&PodCondition>,
    now: SystemTime,
) -> Option<Vec<u8>> {
    let dead = with_death(view, d, clock)?;
    let api_uid = pod.metadata.uid.as_deref()?;
    let (before, alive) = cfg.ledger.claim(d.pod, d.container, |last| {
        // The last submitted first, then what the API has (for the transition time).
        let known = last.or(api_alive);
        if known.is_some_and(|k| k.status == "False") {
            return None;
        }
        let old: Vec<PodCondition> = known.cloned().into_iter().collect();
        let desired = observer_conditions(pod.spec.as_ref(), &dead, &old, &cfg.types, now);
        desired
            .into_iter()
            .find(|c| c.type_ == cfg.types.alive)
            .filter(|c| c.status == "False")
    })?;
    // The base is what was last submitted, else the API's.
    let base: Vec<PodCondition> = before.or_else(|| api_alive.cloned()).into_iter().collect();
    let body = conditions_patch(api_uid, &base, std::slice::from_ref(&alive)).ok()??;
    serde_json::to_vec(&body).ok()
}

impl Writer {
    /// Opens the client (and its connection, kept open: a death never pays for a TCP and TLS
    /// handshake), then claims may be made; keeps the idle connection alive.
    async fn connect(self: Arc<Self>) {
        let client = match super::config(self.cfg.kubeconfig.as_deref(), false)
            .await
            .and_then(Transport::lean)
        {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("the fast status path has no API client ({e}): deaths reach the API through the status manager only");
                return;
            }
        };
        // Until the API first answers, every second; then often enough that the pool (which
        // closes a connection idle for 90 s) keeps it.
        let mut ready = false;
        let mut failures = 0u64;
        loop {
            let answered = client.get("/version", self.cfg.request_timeout).await;
            match answered {
                Ok(_) if !ready => {
                    let _ = self.client.set(client.clone());
                    self.ledger.writer_running(true);
                    if failures > 0 {
                        tracing::info!("the fast status path reached the API server: deaths are written from the kernel reader's thread from now on");
                    }
                    ready = true;
                }
                Ok(_) => {}
                // Said once: until the API answers, every death still reaches it through the
                // status manager, only later.
                Err(e) if !ready && failures == 0 => {
                    failures += 1;
                    tracing::warn!("the fast status path cannot reach the API server ({e}); deaths go through the status manager until it answers (retried every second; check the API server and the agent's network path to it)");
                }
                Err(e) => {
                    failures += 1;
                    tracing::debug!("fast status path's keep-alive: {e}");
                }
            }
            tokio::time::sleep(if ready { KEEPALIVE } else { RETRY }).await;
        }
    }

    async fn write(&self, client: &Transport, d: &Death, patch: FastPatch) {
        // Taken now, observed once answered: the histogram is memory the request need not
        // touch first.
        let handed = SystemTime::now()
            .duration_since(self.clock.to_system_time(d.at))
            .unwrap_or_default();
        let FastPatch {
            namespace,
            name,
            body,
        } = patch;
        let timeout = self.cfg.request_timeout;
        let outcome = send_patch(client, &self.params, &namespace, &name, body, timeout).await;
        if let Some(h) = &self.cfg.latency {
            h.observe(handed.as_secs_f64());
        }
        match outcome {
            WriteOutcome::Written { .. } => {
                bump(&self.stats.written);
                self.ledger.confirm(&d.pod, d.container);
            }
            outcome => {
                // The manager writes the same condition once its view caught up, through its
                // retrying writer.
                self.ledger.fail(&d.pod, d.container);
                bump(&self.stats.failed);
                tracing::debug!(pod = %name, ?outcome, "fast status write not accepted; the status manager writes it");
            }
        }
        // The manager held the pod while the patch was in flight: its turn now.
        if let Some(r) = self.cfg.reconcile.get() {
            r.touch(d.pod);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cond(status: &str, t: &str) -> PodCondition {
        PodCondition {
            type_: "observer.dev/ContainersAlive".into(),
            status: status.into(),
            last_transition_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                t.parse().unwrap(),
            )),
            ..Default::default()
        }
    }

    fn ids() -> (PodUid, ContainerId, ContainerId) {
        (
            PodUid::parse("00000001-0000-0000-0000-000000000000").unwrap(),
            ContainerId::parse(&format!("{:064x}", 1)).unwrap(),
            ContainerId::parse(&format!("{:064x}", 2)).unwrap(),
        )
    }

    /// The fast path claims one False transition; the manager waits until its view shows the
    /// death, then takes the claim's condition and settles it; True is the manager's again.
    #[test]
    fn one_owner_of_the_transition() {
        let (pod, a, b) = ids();
        let ledger = AliveLedger::default();
        let up = cond("True", "2026-12-01T00:00:00Z");
        let down = cond("False", "2026-12-01T00:00:05Z");
        ledger.record(pod, up.clone());
        let (before, claimed) = ledger
            .claim(pod, a, |last| {
                assert_eq!(last, Some(&up));
                Some(down.clone())
            })
            .expect("a transition from True is claimed");
        assert_eq!((before, claimed), (Some(up.clone()), down.clone()));
        // A second death while the first is claimed is not a transition.
        assert!(ledger.claim(pod, b, |_| Some(down.clone())).is_none());
        // The manager's view still says running: it waits rather than write True.
        assert_eq!(ledger.manager_turn(&pod, |_| false), ManagerTurn::Wait);
        // It shows the death, but the fast path's patch is in flight: not sent twice.
        assert_eq!(ledger.manager_turn(&pod, |c| c == a), ManagerTurn::InFlight);
        ledger.confirm(&pod, a);
        assert_eq!(
            ledger.manager_turn(&pod, |c| c == a),
            ManagerTurn::Take {
                alive: down.clone(),
                confirmed: true
            }
        );
        ledger.record(pod, down.clone());
        // Settled and False: a later death is no transition for the fast path.
        assert_eq!(
            ledger.manager_turn(&pod, |_| false),
            ManagerTurn::Free {
                alive: Some(down.clone())
            }
        );
        assert!(ledger.claim(pod, b, |_| Some(down.clone())).is_none());
        // Back to True by the manager: the next death is the fast path's again.
        ledger.record(pod, up);
        assert!(ledger.claim(pod, b, |_| Some(down.clone())).is_some());
        ledger.forget(&pod);
        assert!(ledger.is_empty());
    }

    /// A confirmation for another container than the claimed one changes nothing.
    #[test]
    fn a_stale_confirmation_is_ignored() {
        let (pod, a, b) = ids();
        let ledger = AliveLedger::default();
        let down = cond("False", "2026-12-01T00:00:05Z");
        assert!(ledger.claim(pod, a, |_| Some(down.clone())).is_some());
        ledger.confirm(&pod, b);
        assert_eq!(ledger.manager_turn(&pod, |_| true), ManagerTurn::InFlight);
        // Not accepted: the manager writes it (not confirmed, so it is sent).
        ledger.fail(&pod, a);
        assert_eq!(
            ledger.manager_turn(&pod, |_| true),
            ManagerTurn::Take {
                alive: down,
                confirmed: false
            }
        );
    }

    /// A death's patch made at the manager's turn is the one the full computation gives (the
    /// same JSON, the same condition in the ledger) for every shape of failed death; an exit 0
    /// is left to the full computation.
    #[test]
    fn a_prepared_death_is_the_full_computation() {
        use crate::{
            kernel::WaitStatus,
            kube::testkit::{container, cv, exited, pod, sidecar, spec, view},
            pleg::ExitReason,
        };
        let types = ConditionTypes::new("observer.dev");
        let clock = BootClock::default();
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let run = ContainerPhase::Running;
        let two = spec("Always", vec![], vec![container("app"), container("log")]);
        let with_sidecar = spec("Never", vec![sidecar("proxy")], vec![container("app")]);
        let shapes: Vec<(&str, Option<k8s_openapi::api::core::v1::PodSpec>, PodView)> = vec![
            (
                "one container",
                Some(two.clone()),
                view(vec![cv("app", 0, run), cv("log", 0, run)]),
            ),
            (
                "restarted",
                Some(two.clone()),
                view(vec![cv("app", 3, run), cv("log", 1, run)]),
            ),
            (
                "another already dead",
                Some(two.clone()),
                view(vec![cv("app", 0, run), exited("log", 0, 2, "Error")]),
            ),
            (
                "another not started",
                Some(two),
                view(vec![cv("app", 0, run)]),
            ),
            (
                "a sidecar",
                Some(with_sidecar),
                view(vec![cv("proxy", 0, run), cv("app", 0, run)]),
            ),
            (
                "no spec",
                None,
                view(vec![cv("app", 0, run), cv("log", 0, run)]),
            ),
        ];
        let endings = [
            (WaitStatus::exited(1), ExitReason::Error),
            (WaitStatus::exited(0), ExitReason::Completed),
            (WaitStatus::signaled(9, false), ExitReason::OomKilled),
            (WaitStatus::signaled(11, true), ExitReason::Error),
        ];
        let mut made = 0;
        for (shape, spec, view) in &shapes {
            let api = Arc::new(pod(spec.clone().unwrap_or_default(), None));
            let api = if spec.is_some() {
                api
            } else {
                Arc::new(Pod {
                    spec: None,
                    ..(*api).clone()
                })
            };
            for c in view.containers.iter().filter(|c| c.phase == run) {
                for (status, reason) in endings {
                    let death = Death {
                        pod: view.uid,
                        container: c.id,
                        at: BootClock::now(),
                        exit: ContainerExit {
                            status: Some(status),
                            reason,
                            pid: Some(4242),
                            comm: None,
                        },
                    };
                    let decider = |prepared: bool| {
                        let ledger = Arc::new(AliveLedger::default());
                        ledger.prepare(view.uid, view, &api, &types);
                        if !prepared {
                            let mut map = ledger.pods.lock().unwrap();
                            let e = map.get_mut(&view.uid).unwrap();
                            let b = e.basis.take().unwrap();
                            e.basis = Some(Arc::new(Basis {
                                view: b.view.clone(),
                                pod: Arc::clone(&b.pod),
                                prepared: Vec::new(),
                            }));
                        }
                        Decider {
                            types: types.clone(),
                            ledger,
                            stats: Arc::default(),
                        }
                    };
                    let (fast, full) = (decider(true), decider(false));
                    let has = fast
                        .ledger
                        .basis(&view.uid)
                        .unwrap()
                        .prepared
                        .iter()
                        .any(|p| p.container == c.id);
                    let what = format!("{shape}, {} {status:?}", c.name);
                    let a = decide_at(&fast, &death, &clock, now);
                    let b = decide_at(&full, &death, &clock, now);
                    let json = |p: &Option<FastPatch>| {
                        p.as_ref()
                            .map(|p| serde_json::from_slice::<serde_json::Value>(&p.body).unwrap())
                    };
                    assert_eq!(json(&a), json(&b), "{what}");
                    assert!(
                        b.is_some() || !Prepared::fits(&death),
                        "{what}: every failed death here is a transition"
                    );
                    let alive =
                        |d: &Decider| crate::sync::lock(&d.ledger.pods)[&view.uid].alive.clone();
                    assert_eq!(alive(&fast), alive(&full), "{what}");
                    if Prepared::fits(&death) {
                        assert!(
                            has,
                            "{what}: a running container's failed death is made ahead"
                        );
                        made += 1;
                    }
                }
            }
        }
        assert!(made >= 20, "{made} prepared deaths checked");
    }
}
