//! The fast path of `observer run` (`conditions` mode): a container's death from the PLEG's
//! thread to the `ContainersAlive=False` PATCH, without waiting for the reconciler, the status
//! manager or the CRI, and on a real-time thread of its own (`--realtime-priority`: see
//! [`crate::sched`] for the bound), so that the request does not wait behind the node's workloads.
//!
//! - [`FastDeaths`] runs on the PLEG's thread: it only hands each death (the kernel saw the init
//!   exit, with its status) to the writer's thread, never blocking (a full queue drops it: the
//!   normal path writes it anyway, and the drop is counted).
//! - The writer's thread has a current-thread tokio runtime and a client of its own (one
//!   kept-alive connection). For each death it reads the pod's reconciled view (the container's
//!   name and restart count, already known from its start) and the pod from the reflector,
//!   applies the kernel's exit as the reconciler will, and computes the condition with the same
//!   function as the manager ([`observer_conditions`]). Only a transition to False is written
//!   here; every request runs in a task of its own with the request timeout, so a hung API server
//!   never holds up the next death.
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
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, SystemTime},
};

use ::kube::{api::PatchParams, Client};
use k8s_openapi::api::core::v1::PodCondition;
use tokio::sync::mpsc;

use super::{
    conditions::{observer_conditions, ConditionTypes},
    patch::conditions_patch,
    pods::NodePods,
    writer::{send, WriteJob, WriteOutcome},
};
use crate::{
    cgroup::{ContainerId, PodUid},
    kernel::{BootClock, BootNs},
    pleg::{ContainerExit, FastPath, PlegEvent, PodLifecycleEvent},
    reconcile::{ContainerPhase, PodView, ReconcileHandle, Source},
    sched::Granted,
};

/// Deaths waiting for the writer's thread; beyond it they are left to the normal path.
pub const QUEUE: usize = 1024;

/// How often the writer's idle connection is used (`GET /version`), so that it stays open.
const KEEPALIVE: Duration = Duration::from_secs(30);

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
    /// Deaths handed to the writer's thread, and those dropped because its queue was full.
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

/// On the PLEG's thread: every death with a known exit to the writer's thread.
pub struct FastDeaths {
    tx: mpsc::Sender<Death>,
    stats: Arc<FastStats>,
}

impl FastDeaths {
    /// The hook and the writer's end of its queue.
    pub fn new(stats: Arc<FastStats>) -> (Self, mpsc::Receiver<Death>) {
        let (tx, rx) = mpsc::channel(QUEUE);
        (Self { tx, stats }, rx)
    }
}

impl FastPath for FastDeaths {
    fn event(&mut self, ev: &PodLifecycleEvent, _sent: SystemTime) {
        let PlegEvent::ContainerDied { id, exit } = &ev.event else {
            return;
        };
        if exit.status.is_none() {
            return;
        }
        let death = Death {
            pod: ev.pod_uid,
            container: *id,
            at: ev.at,
            exit: exit.clone(),
        };
        match self.tx.try_send(death) {
            Ok(()) => bump(&self.stats.deaths),
            Err(_) => bump(&self.stats.dropped),
        }
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
}

/// The last `ContainersAlive` submitted per pod, and the fast path's claims.
#[derive(Debug, Default)]
pub struct AliveLedger(Mutex<HashMap<PodUid, Entry>>);

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
        let mut map = crate::sync::lock(&self.0);
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

    /// The fast path's patch for `container` was accepted.
    pub fn confirm(&self, pod: &PodUid, container: ContainerId) {
        if let Some(c) = crate::sync::lock(&self.0)
            .get_mut(pod)
            .and_then(|e| e.claim.as_mut())
            .filter(|c| c.container == container)
        {
            c.confirmed = true;
        }
    }

    /// The fast path's patch for `container` was not accepted: the manager is to write it.
    pub fn fail(&self, pod: &PodUid, container: ContainerId) {
        if let Some(c) = crate::sync::lock(&self.0)
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
        let map = crate::sync::lock(&self.0);
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
        let mut map = crate::sync::lock(&self.0);
        let e = map.entry(pod).or_default();
        e.alive = Some(alive);
        e.claim = None;
    }

    pub fn forget(&self, pod: &PodUid) {
        crate::sync::lock(&self.0).remove(pod);
    }

    pub fn len(&self) -> usize {
        crate::sync::lock(&self.0).len()
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

/// What the writer's thread needs.
pub struct FastConfig {
    pub kubeconfig: Option<OsString>,
    pub types: ConditionTypes,
    pub field_manager: String,
    pub request_timeout: Duration,
    pub reconcile: ReconcileHandle,
    pub pods: NodePods,
    pub ledger: Arc<AliveLedger>,
    pub clock: BootClock,
    pub stats: Arc<FastStats>,
    /// `--realtime-priority`: the thread's policy as the kernel reader's.
    pub realtime: Option<u8>,
    /// Observes the seconds from the kernel's exit to the patch handed to the HTTP client.
    pub latency: Option<prometheus_client::metrics::histogram::Histogram>,
}

/// Starts the writer's thread. It ends when the hook's end of `deaths` is dropped.
/// Starts the writer's thread. The receiver resolves when the thread ends: `Ok` when the PLEG's
/// stream ended (or the writer could not start, which it said), `Err(why)` when it panicked, for
/// the agent's supervision to report (`/healthz`).
pub fn spawn(
    cfg: FastConfig,
    deaths: mpsc::Receiver<Death>,
) -> std::io::Result<tokio::sync::oneshot::Receiver<Result<(), String>>> {
    let (ended, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("observer-fast".into())
        .spawn(move || {
            let run = std::panic::AssertUnwindSafe(move || writer_thread(cfg, deaths));
            let r = std::panic::catch_unwind(run).map_err(crate::runner::panic_message);
            let _ = ended.send(r);
        })?;
    Ok(rx)
}

fn writer_thread(cfg: FastConfig, deaths: mpsc::Receiver<Death>) {
    let granted = match cfg.realtime {
        Some(p) => crate::sched::realtime_or_say_once(p, "the fast status writer"),
        None => Granted::Normal,
    };
    tracing::debug!(?granted, "fast status writer started");
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::warn!("the fast status writer did not start ({e}): deaths reach the API through the status manager only");
            return;
        }
    };
    rt.block_on(run(cfg, deaths));
}

async fn run(cfg: FastConfig, mut deaths: mpsc::Receiver<Death>) {
    // A client of this runtime's own: its connection is kept alive here, off the main runtime.
    let client = match super::client(cfg.kubeconfig.as_deref()).await {
        Ok(c) => c.client,
        Err(e) => {
            tracing::warn!("the fast status writer has no API client ({e}): deaths reach the API through the status manager only");
            return;
        }
    };
    let cfg = Arc::new(cfg);
    let params = PatchParams {
        field_manager: Some(cfg.field_manager.clone()),
        ..Default::default()
    };
    // The connection is opened now and kept open (the client's pool closes an idle one after
    // 90 s): a death never pays for a TCP and TLS handshake.
    let mut keepalive = tokio::time::interval(KEEPALIVE);
    keepalive.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let d = tokio::select! {
            d = deaths.recv() => match d {
                Some(d) => d,
                None => return,
            },
            _ = keepalive.tick() => {
                let client = client.clone();
                tokio::spawn(async move {
                    if let Err(e) = client.apiserver_version().await {
                        tracing::debug!("fast status writer's keep-alive: {e}");
                    }
                });
                continue;
            }
        };
        let Some(job) = decide(&cfg, &d) else {
            bump(&cfg.stats.skipped);
            continue;
        };
        let (cfg, client, params) = (Arc::clone(&cfg), client.clone(), params.clone());
        // A task per request: one that hangs never holds up the next death.
        tokio::spawn(async move { write(&cfg, &client, &params, &d, job).await });
    }
}

/// The patch for a death, when it is a transition to False the fast path claimed.
fn decide(cfg: &FastConfig, d: &Death) -> Option<WriteJob> {
    let view = cfg.reconcile.pod(&d.pod)?;
    let pod = cfg.pods.by_uid(d.pod.as_str())?;
    let dead = with_death(&view, d, &cfg.clock)?;
    let api_uid = pod.metadata.uid.clone()?;
    let api_conditions = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let now = SystemTime::now();
    let (before, alive) = cfg.ledger.claim(d.pod, d.container, |last| {
        // The last submitted first, then what the API has (for the transition time).
        let api_alive = api_conditions.iter().find(|c| c.type_ == cfg.types.alive);
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
    let base: Vec<PodCondition> = before
        .or_else(|| {
            api_conditions
                .iter()
                .find(|c| c.type_ == cfg.types.alive)
                .cloned()
        })
        .into_iter()
        .collect();
    let body = conditions_patch(&api_uid, &base, std::slice::from_ref(&alive)).ok()??;
    let desired = serde_json::to_value(std::slice::from_ref(&alive)).ok()?;
    Some(WriteJob {
        namespace: view.namespace.clone(),
        name: view.name.clone(),
        uid: d.pod,
        body: Arc::new(body),
        desired: Arc::new(desired),
        observed_at: tokio::time::Instant::now(),
    })
}

async fn write(cfg: &FastConfig, client: &Client, params: &PatchParams, d: &Death, job: WriteJob) {
    if let Some(h) = &cfg.latency {
        let after = SystemTime::now()
            .duration_since(cfg.clock.to_system_time(d.at))
            .unwrap_or_default();
        h.observe(after.as_secs_f64());
    }
    match send(client, params, &job, cfg.request_timeout).await {
        WriteOutcome::Written { .. } => {
            bump(&cfg.stats.written);
            cfg.ledger.confirm(&d.pod, d.container);
        }
        outcome => {
            // The manager writes the same condition once its view caught up, through its
            // retrying writer.
            cfg.ledger.fail(&d.pod, d.container);
            bump(&cfg.stats.failed);
            tracing::debug!(pod = %job.name, ?outcome, "fast status write not accepted; the status manager writes it");
        }
    }
    // The manager held the pod while the patch was in flight: its turn now.
    cfg.reconcile.touch(d.pod);
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
}
