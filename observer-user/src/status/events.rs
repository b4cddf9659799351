//! Events (events.k8s.io/v1) through kube's [`Recorder`]: OOM kills, container deaths, audit
//! findings. Rate-limited per pod, with bounded memory, published off the status path.
//!
//! kube 5's Recorder de-duplicates on (type, action, reason, reporter, regarding, related), not
//! on the note: a repeat bumps the first event's series count and keeps the first note. So the
//! key must determine the note:
//! - `regarding` is the pod with kubelet's container field path (`spec.containers{app}`), so
//!   two containers never share an event (ObjectReference equality includes the field path);
//! - an OOM kill's action names the victim (`OOMKill/<pid>@<unix second>`): each victim is its
//!   own event, its note naming it; the action does not show in `kubectl describe`;
//! - a death's action is its exit (`Exit/<code>` or `Signal/<n>`) and its reason the exit
//!   reason: a crash loop dying the same way folds into one event with a series count, and a
//!   different death is a new event; a death told late (the agent was down) names its finish,
//!   `Late/<exit>@<unix second>`: its own event, which a later agent finds before telling it again;
//! - an audit finding's action names the container instance (`Audit/<container id>`).
//!
//! Memory: the per-pod token buckets are dropped when the pod leaves and capped in number; the
//! queue to the publishing task is bounded (overflow is dropped and counted); the Recorder's own
//! cache keeps an event for 6 minutes, so it holds at most what the rate limit lets through.
use std::{
    future::Future,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use ::kube::{
    runtime::events::{Event, EventType, Recorder, Reporter},
    Client,
};
use k8s_openapi::api::{core::v1::ObjectReference, events::v1::Event as K8sEvent};
use tokio::sync::mpsc;

use super::{
    audit::Finding,
    conditions::{describe_kill, kib},
};
use crate::{
    cri::PodRef,
    ratelimit::{KeyedLimiter, Rate},
    reconcile::{ContainerView, OomEvidence},
};

/// Events' limits.
#[derive(Clone, Debug)]
pub struct EventConfig {
    /// Events waiting to be published, over all pods.
    pub queue: usize,
    /// Events a pod may publish at once...
    pub burst: u32,
    /// ...then one per this period.
    pub refill: Duration,
    /// Pods whose rate limit is remembered at once.
    pub max_pods: usize,
    /// Per publish (create or patch).
    pub timeout: Duration,
    /// How long an Event is sent again while the API is away before it is dropped (counted in
    /// `observer_events_failed_total`): an outage longer than this loses its Events, told in
    /// the node's log meanwhile.
    pub max_age: Duration,
}

impl Default for EventConfig {
    fn default() -> Self {
        Self {
            queue: 512,
            burst: 8,
            refill: Duration::from_secs(15),
            max_pods: 4096,
            timeout: Duration::from_secs(10),
            max_age: Duration::from_secs(600),
        }
    }
}

/// What happened.
#[derive(Clone, Debug)]
pub(crate) enum PodEvent {
    OomKill {
        container: String,
        init_container: bool,
        victim: Box<OomEvidence>,
        /// The container's memory limit, from its spec.
        limit: Option<String>,
        /// The container as the view had it (for the note).
        view: Option<Box<ContainerView>>,
    },
    ContainerDied {
        container: String,
        init_container: bool,
        exit_code: Option<i32>,
        signal: Option<u8>,
        reason: Option<String>,
        /// The kernel's probes reported it (not only the runtime's record).
        kernel_seen: bool,
        /// Told late, from the runtime's record: the agent was not running when the container
        /// died, or was stopped before telling it.
        late: Option<Late>,
    },
    Audit(Finding),
    /// A warning that the container is about to be OOM-killed (`crate::pressure`).
    MemoryNearLimit {
        container: String,
        init_container: bool,
        reading: Box<crate::pressure::Reading>,
        /// Warnings raised for this container instance so far (this one included).
        nth: u32,
    },
}

/// A death told late, from the runtime's record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Late {
    /// Since when the pod's `ContainersAlive` had stood as `stood`.
    pub since: SystemTime,
    /// When the container finished, as the runtime recorded it.
    pub finished: SystemTime,
    /// What the API's condition said of the death when this agent started.
    pub stood: Stood,
    /// This agent's start: an earlier agent's Event about the death is from before it.
    pub started: SystemTime,
    /// Where the runtime's record lost the exit (containerd restarted after the container died
    /// and wrote exit 255 `Unknown`, finished at its own restart): the container instance's
    /// start. The exit and the finish then name nothing, and any death Event of this container
    /// published since that start is this instance's death (it dies once; the next instance is
    /// started after the runtime came back).
    pub exit_lost_since: Option<SystemTime>,
}

/// What the API's `ContainersAlive` said of a death that finished before the agent started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stood {
    /// True since before the death: no agent wrote its False.
    True,
    /// False since the death: an earlier agent wrote it, and may have been stopped before its
    /// Event went out.
    False,
}

/// The first wait before an Event is sent again, and the longest.
const RETRY_INITIAL: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(10);

/// Whether sending again can help: the API server away (transport errors), overloaded (5xx) or
/// throttling (429). A refusal of the Event itself (400, 403, 404, 422) is final.
fn retryable(e: &::kube::Error) -> bool {
    match e {
        ::kube::Error::Api(s) => s.code == 429 || s.code >= 500,
        ::kube::Error::HyperError(_) | ::kube::Error::Service(_) => true,
        _ => false,
    }
}

/// Counters, readable while the publisher runs.
#[derive(Debug, Default)]
pub(crate) struct EventStats {
    pub queued: AtomicU64,
    pub published: AtomicU64,
    pub failed: AtomicU64,
    /// Attempts that failed (each retry of an Event counts).
    pub failures: AtomicU64,
    /// Events sent again after a failure that could pass (the API away, 5xx, 429).
    pub retried: AtomicU64,
    /// Over the pod's rate limit.
    pub rate_limited: AtomicU64,
    /// The queue was full.
    pub overflow: AtomicU64,
    /// Deaths told late that an earlier agent had told already (its Event was found).
    pub already_told: AtomicU64,
    /// Deaths an earlier agent wrote False for whose Event could not be looked for (the API
    /// away, the list refused): not told, most likely told already.
    pub unknown_not_told: AtomicU64,
    /// Creates whose answer never came, found created when about to be sent again.
    pub landed_unanswered: AtomicU64,
    /// Queued, not yet published or failed (a gauge).
    pub pending: AtomicU64,
}

fn get(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

impl EventStats {
    pub(crate) fn snapshot(&self) -> [u64; 7] {
        [
            get(&self.queued),
            get(&self.published),
            get(&self.failed),
            get(&self.retried),
            get(&self.rate_limited),
            get(&self.overflow),
            get(&self.pending),
        ]
    }
}

const NOTE_LIMIT: usize = 1024;

impl PodEvent {
    /// The Recorder's event, and the field path of `regarding`.
    pub(crate) fn render(&self) -> (Event, String) {
        let field = |c: &str, init: bool| {
            if init {
                format!("spec.initContainers{{{c}}}")
            } else {
                format!("spec.containers{{{c}}}")
            }
        };
        let (type_, reason, action, note, path) = match self {
            PodEvent::OomKill {
                container,
                init_container,
                victim,
                limit,
                view,
                ..
            } => {
                let secs = victim
                    .time
                    .duration_since(UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0);
                let note = describe_kill(victim, view.as_deref(), limit.as_deref());
                (
                    EventType::Warning,
                    if victim.init == Some(true) {
                        "OOMKilled"
                    } else {
                        "ProcessOOMKilled"
                    }
                    .to_string(),
                    format!("OOMKill/{}@{secs}", victim.pid),
                    note,
                    field(container, *init_container),
                )
            }
            PodEvent::ContainerDied {
                container,
                init_container,
                exit_code,
                signal,
                reason,
                kernel_seen,
                late,
            } => {
                let reason = reason.clone().unwrap_or_else(|| "Unknown".into());
                let (action, how) = match (signal, exit_code) {
                    (Some(s), code) => (
                        format!("Signal/{s}"),
                        format!(
                            "was killed by signal {s} (exit code {})",
                            code.unwrap_or(128 + i32::from(*s))
                        ),
                    ),
                    (None, Some(c)) => (format!("Exit/{c}"), format!("exited with code {c}")),
                    (None, None) => ("Exit/unknown".into(), "is gone, how is unknown".into()),
                };
                let ok = *exit_code == Some(0) && signal.is_none();
                // A late tell names its death (the runtime's finish, to the second): its own
                // Event, never folded into a live series, and the key a later agent looks for
                // before telling the same death again.
                let action = match late {
                    Some(l) => format!(
                        "Late/{action}@{}",
                        l.finished
                            .duration_since(UNIX_EPOCH)
                            .map_or(0, |d| d.as_secs())
                    ),
                    None => action,
                };
                (
                    if ok {
                        EventType::Normal
                    } else {
                        EventType::Warning
                    },
                    if ok {
                        "ContainerCompleted".into()
                    } else {
                        format!("ContainerDied{reason}")
                    },
                    action,
                    match late {
                        None if *kernel_seen => {
                            format!("container {container} {how}: {reason} (seen by the kernel)")
                        }
                        None => format!(
                            "container {container} {how}: {reason} (seen in the runtime's record: the kernel's probes did not report it, not yet attached or their ring full)"
                        ),
                        Some(late) if late.stood == Stood::True => format!(
                            "container {container} {how}: {reason} (told late, from the runtime's record: the agent was not running when it died; ContainersAlive had stood True since {}; an earlier death in the same gap, if any, is no longer in the runtime's record)",
                            crate::status::compute::rfc3339(late.since)
                        ),
                        Some(late) => format!(
                            "container {container} {how}: {reason} (told late, from the runtime's record: the agent that wrote ContainersAlive False at {} was stopped before its Event went out)",
                            crate::status::compute::rfc3339(late.since)
                        ),
                    },
                    field(container, *init_container),
                )
            }
            PodEvent::MemoryNearLimit {
                container,
                init_container,
                reading,
                nth,
            } => (
                EventType::Warning,
                "MemoryNearLimit".to_string(),
                // Recorder's de-dup key ignores the note: one series per container and warning.
                format!("MemoryNearLimit/{container}#{nth}"),
                format!(
                    "container {container} is about to be OOM-killed: {}",
                    reading.sentence()
                ),
                field(container, *init_container),
            ),
            PodEvent::Audit(f) => (
                EventType::Warning,
                f.kind.reason().to_string(),
                format!("Audit/{}", &f.container_id[..f.container_id.len().min(64)]),
                f.message(),
                field(&f.container, f.init),
            ),
        };
        let mut note = note;
        if note.len() > NOTE_LIMIT {
            let mut cut = NOTE_LIMIT - 3;
            while !note.is_char_boundary(cut) {
                cut -= 1;
            }
            note.truncate(cut);
            note.push_str("...");
        }
        (
            Event {
                type_,
                reason: truncate(reason, 128),
                note: Some(note),
                action: truncate(action, 128),
                secondary: None,
            },
            path,
        )
    }
}

fn truncate(mut s: String, n: usize) -> String {
    if s.len() > n {
        let mut cut = n;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

/// An Event on its way to the publishing task, and the death it tells late, if it does.
type Queued = (ObjectReference, Event, Option<Late>);

/// Whether an earlier agent (`controller`) already told the death `late` names, which the Event
/// with `action` (`Late/<exit>@<finished>`) tells late about the container `reference` names:
/// - by that same late tell (an agent started in between told it, and was stopped in turn);
/// - or live: its death Event for that container (the same exit), published between the death
///   and this agent's start (it wrote that Event, then was stopped before its False reached
///   the API, or after).
///
/// A live tell published since this agent started is of a later death, and another death's
/// late tell is another death: neither counts.
async fn told_already(
    client: &Client,
    reference: &ObjectReference,
    controller: &str,
    action: &str,
    late: &Late,
) -> Result<bool, ::kube::Error> {
    let ours = ours_about(client, reference, controller).await?;
    Ok(ours.iter().any(|e| tells(e, action, late)))
}

/// The Events `controller` published about the container `reference` names (listed by the
/// pod's UID).
async fn ours_about(
    client: &Client,
    reference: &ObjectReference,
    controller: &str,
) -> Result<Vec<K8sEvent>, ::kube::Error> {
    let api: ::kube::Api<K8sEvent> = ::kube::Api::namespaced(
        client.clone(),
        reference.namespace.as_deref().unwrap_or_default(),
    );
    let params = ::kube::api::ListParams::default().fields(&format!(
        "regarding.uid={}",
        reference.uid.as_deref().unwrap_or_default()
    ));
    let mut items = api.list(&params).await?.items;
    items.retain(|e| {
        e.reporting_controller.as_deref() == Some(controller)
            && e.regarding.as_ref().and_then(|r| r.field_path.as_deref())
                == reference.field_path.as_deref()
    });
    Ok(items)
}

/// Whether `e` is `event` created since `since`: a create whose answer never came
/// ([`answer_lost`]) that landed.
/// Only a new Event counts: a series update sent again is the same count, so it is sent again.
fn created_since(e: &K8sEvent, event: &Event, since: SystemTime) -> bool {
    e.series.is_none()
        && e.action.as_deref() == Some(event.action.as_str())
        && e.reason.as_deref() == Some(event.reason.as_str())
        // The Recorder stamps the Event when it makes it, after `since`, on this clock; the API
        // keeps microseconds.
        && e.event_time
            .as_ref()
            .is_some_and(|t| SystemTime::from(t.0) + Duration::from_millis(1) >= since)
}

/// Whether a publish may have landed though it did not answer success: no answer in time, or the
/// API server's 504 (its storage did not answer in time; the write may be committed).
fn answer_lost<T>(r: &Result<Result<T, ::kube::Error>, tokio::time::error::Elapsed>) -> bool {
    match r {
        Err(_) => true,
        Ok(Err(::kube::Error::Api(s))) => s.code == 504,
        Ok(_) => false,
    }
}

/// Whether `e` (about the right container, by the right controller) tells the death `late`
/// names, whose late tell's action is `action`.
fn tells(e: &K8sEvent, action: &str, late: &Late) -> bool {
    let Some(found) = e.action.as_deref() else {
        return false;
    };
    if found == action {
        return true;
    }
    if let Some(instance) = late.exit_lost_since {
        let death = ["Exit/", "Signal/", "Late/"]
            .iter()
            .any(|p| found.starts_with(p));
        return death && observed(e).is_some_and(|at| at >= instance && at <= late.started);
    }
    let Some(live) = action
        .strip_prefix("Late/")
        .and_then(|a| a.rsplit_once('@'))
        .map(|(a, _)| a)
    else {
        return false;
    };
    // The runtime records a signal's death as its exit code (`Exit/137`), the kernel as the
    // signal (`Signal/9`): the same death.
    let same = live == found || exit_code(live).is_some_and(|c| exit_code(found) == Some(c));
    if !same {
        return false;
    }
    let Some(at) = observed(e) else {
        return false;
    };
    // The runtime's finish and the Event's time are the node's clock; the API keeps
    // microseconds. A second's slack below the finish (never two deaths of one container in
    // it: a restart takes longer).
    at + Duration::from_secs(1) >= late.finished && at <= late.started
}

/// When `e` last told a death: a series' last observation is its latest death's; the Event's
/// time, its only one's.
fn observed(e: &K8sEvent) -> Option<SystemTime> {
    e.series
        .as_ref()
        .map(|s| s.last_observed_time.0)
        .or(e.event_time.as_ref().map(|t| t.0))
        .map(SystemTime::from)
}

/// The exit code a death Event's action stands for: `Exit/<code>`, or `Signal/<n>` as 128 + n.
fn exit_code(action: &str) -> Option<i64> {
    if let Some(code) = action.strip_prefix("Exit/") {
        return code.parse().ok();
    }
    action
        .strip_prefix("Signal/")
        .and_then(|n| n.parse::<i64>().ok())
        .map(|n| 128 + n)
}

/// kubelet's reference to a container of a pod.
pub fn regarding(pod: &PodRef, field_path: String) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(pod.name.clone()),
        namespace: Some(pod.namespace.clone()),
        uid: Some(pod.uid.clone()),
        field_path: Some(field_path),
        resource_version: None,
    }
}

/// Takes events from the status manager, rate-limits them per pod and queues them for the
/// publishing task.
pub(crate) struct EventPublisher {
    tx: mpsc::Sender<Queued>,
    limits: KeyedLimiter<String>,
    stats: Arc<EventStats>,
}

/// The task that publishes, one Event at a time in queue order.
struct Worker {
    client: Client,
    recorder: Recorder,
    controller: String,
    stats: Arc<EventStats>,
    timeout: Duration,
    max_age: Duration,
    /// Names the API server in reports.
    url: String,
    /// Listing Events was refused (403), said once: the RBAC of an older release.
    list_refused: bool,
}

impl Worker {
    async fn run(mut self, mut rx: mpsc::Receiver<Queued>) {
        while let Some((reference, event, late)) = rx.recv().await {
            if let Some(late) = late {
                if self.told_before(&reference, &event, &late).await {
                    self.stats.pending.fetch_sub(1, Ordering::Relaxed);
                    continue;
                }
                // The node's log says it too, for log pipelines (as the manager says a live
                // tell).
                tracing::info!(
                    namespace = reference.namespace.as_deref().unwrap_or_default(),
                    pod = reference.name.as_deref().unwrap_or_default(),
                    reason = %event.reason,
                    "{}",
                    event.note.as_deref().unwrap_or_default()
                );
            }
            self.send(&reference, &event).await;
            self.stats.pending.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Whether a death told late was told by an earlier agent already (killed again before its
    /// own ContainersAlive write, or after its live Event): its Event says so.
    async fn told_before(
        &mut self,
        reference: &ObjectReference,
        event: &Event,
        late: &Late,
    ) -> bool {
        let found = tokio::time::timeout(
            self.timeout,
            told_already(
                &self.client,
                reference,
                &self.controller,
                &event.action,
                late,
            ),
        )
        .await;
        let known = match found {
            Ok(Ok(told)) => Some(told),
            Ok(Err(::kube::Error::Api(s))) if s.code == 403 && !self.list_refused => {
                // An operator's to fix, once: the RBAC of an older release.
                self.list_refused = true;
                tracing::warn!("the API refuses to list Events (403): a death told late may be told again by each agent restarted in a row, or an earlier agent's untold Event not told; grant events.k8s.io events `list` to the agent (deploy/rbac.yaml)");
                None
            }
            Ok(Err(e)) => {
                tracing::debug!("whether an earlier agent told a death could not be read ({e})");
                None
            }
            Err(_) => {
                tracing::debug!(
                    "whether an earlier agent told a death could not be read in {:?}",
                    self.timeout
                );
                None
            }
        };
        // Unknown: a death no agent wrote False for is told, rather than risk not telling it;
        // one an earlier agent wrote False for almost always had its Event too, and is not told
        // twice on a guess.
        let skip = match known {
            Some(told) => told,
            None => late.stood == Stood::False,
        };
        if skip {
            let counter = if known.is_some() {
                &self.stats.already_told
            } else {
                &self.stats.unknown_not_told
            };
            counter.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(reason = %event.reason, told = ?known, "a death an earlier agent told, or wrote False for: not told again");
        }
        skip
    }

    /// Publishes one Event. An API server that is away, overloaded or throttling: the Event
    /// waits (in order: the ones behind it would fail the same way) and is sent again, with
    /// back-off, until it is `max_age` old. A series update is a PATCH of its count, the same
    /// when sent again. A create whose answer never came may have landed: before it is sent
    /// again, the pod's Events are looked at, and one this attempt created is the Event
    /// published (not a second).
    async fn send(&self, reference: &ObjectReference, event: &Event) {
        let timeout = self.timeout;
        let stats = &self.stats;
        let queued = tokio::time::Instant::now();
        let mut delay = RETRY_INITIAL;
        // When the first attempt whose answer never came was sent.
        let mut unanswered: Option<SystemTime> = None;
        loop {
            // Before a create whose answer never came is sent again: did it land?
            let found = match unanswered.filter(|_| !self.list_refused) {
                Some(since) => Some(
                    tokio::time::timeout(
                        timeout,
                        ours_about(&self.client, reference, &self.controller),
                    )
                    .await
                    .map(|r| r.map(|ours| ours.iter().any(|e| created_since(e, event, since)))),
                ),
                None => None,
            };
            let r = match found {
                Some(Ok(Ok(true))) => {
                    stats.landed_unanswered.fetch_add(1, Ordering::Relaxed);
                    stats.published.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(reason = %event.reason, "an Event whose create went unanswered was created: not sent again");
                    return;
                }
                // Cannot tell yet (the API still away): wait as for a failed create.
                Some(Ok(Err(e))) if !matches!(&e, ::kube::Error::Api(s) if s.code == 403) => {
                    Ok(Err(e))
                }
                Some(Err(elapsed)) => Err(elapsed),
                // Not there, or the list not ours to read: send it.
                _ => {
                    let attempt = SystemTime::now();
                    let r = tokio::time::timeout(timeout, self.recorder.publish(event, reference))
                        .await;
                    if unanswered.is_none() && answer_lost(&r) {
                        unanswered = Some(attempt);
                    }
                    r
                }
            };
            let failed = match r {
                Ok(Ok(())) => {
                    stats.published.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                failed => failed,
            };
            let retry = match &failed {
                Ok(Err(e)) => retryable(e),
                _ => true,
            };
            let n = stats.failures.fetch_add(1, Ordering::Relaxed);
            // One line per power of two: an API outage does not flood the log.
            if n.is_power_of_two() || n == 0 {
                let why = match failed {
                    Ok(Err(e)) => crate::kube::describe_api_error(&e, &self.url),
                    _ => format!("no answer within {timeout:?}"),
                };
                let then = if retry { "retrying" } else { "dropped" };
                tracing::warn!(failures = n + 1, reason = %event.reason, "event not published: {why}; {then}");
            }
            if !retry || queued.elapsed() + delay > self.max_age {
                stats.failed.fetch_add(1, Ordering::Relaxed);
                return;
            }
            stats.retried.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(RETRY_MAX);
        }
    }
}

impl EventPublisher {
    /// The publisher, and the task that publishes (spawn it; it ends when the publisher is
    /// dropped and its queue is empty). `url` names the API server in reports.
    pub(crate) fn new(
        client: Client,
        reporter: Reporter,
        cfg: EventConfig,
        url: &str,
    ) -> (Self, impl Future<Output = ()> + Send + 'static) {
        let (tx, rx) = mpsc::channel::<Queued>(cfg.queue.max(1));
        let stats = Arc::new(EventStats::default());
        let controller = reporter.controller.clone();
        let worker = Worker {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            controller,
            stats: Arc::clone(&stats),
            timeout: cfg.timeout,
            max_age: cfg.max_age,
            url: url.to_string(),
            list_refused: false,
        };
        (
            Self {
                tx,
                limits: KeyedLimiter::new(
                    Rate {
                        burst: cfg.burst,
                        refill: cfg.refill,
                    },
                    cfg.max_pods,
                ),
                stats,
            },
            worker.run(rx),
        )
    }

    /// Queues the event unless the pod is over its rate or the queue is full (both counted).
    /// Returns whether it was queued.
    pub(crate) fn publish(&mut self, pod: &PodRef, ev: &PodEvent) -> bool {
        if !self.limits.take(pod.uid.as_str()).allowed() {
            self.stats.rate_limited.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(pod = %pod.name, "event over the pod's rate limit: dropped");
            return false;
        }
        let (event, path) = ev.render();
        let late = match ev {
            PodEvent::ContainerDied { late, .. } => *late,
            _ => None,
        };
        self.stats.pending.fetch_add(1, Ordering::Relaxed);
        match self.tx.try_send((regarding(pod, path), event, late)) {
            Ok(()) => {
                self.stats.queued.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(_) => {
                self.stats.pending.fetch_sub(1, Ordering::Relaxed);
                self.stats.overflow.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// The pod left the node: its rate limit is forgotten.
    pub(crate) fn forget(&mut self, uid: &str) {
        self.limits.forget(uid);
    }

    pub(crate) fn stats(&self) -> Arc<EventStats> {
        Arc::clone(&self.stats)
    }

    /// Events queued and not yet published.
    pub(crate) fn pending(&self) -> u64 {
        self.stats
            .pending
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Pods whose rate limit is remembered.
    #[cfg(test)]
    pub(crate) fn tracked_pods(&self) -> usize {
        self.limits.len()
    }
}

/// "63.5 MiB" for the notes of other modules.
pub fn memory(kb: Option<u64>) -> String {
    kb.map(kib).unwrap_or_else(|| "unknown".into())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::events::v1::Event as K8sEvent;

    use super::*;
    use crate::kube::testkit::{api::*, *};
    use crate::reconcile::ContainerPhase;

    fn pod_ref() -> PodRef {
        PodRef {
            uid: UID.into(),
            namespace: NS.into(),
            name: NAME.into(),
        }
    }

    fn kill(pid: u32, comm: &str) -> PodEvent {
        let c = cv("app", 0, ContainerPhase::Running);
        PodEvent::OomKill {
            container: "app".into(),
            init_container: false,
            victim: Box::new(oom(&c, pid, comm, false)),
            limit: Some("64Mi".into()),
            view: Some(Box::new(c)),
        }
    }

    fn publisher(cfg: EventConfig) -> (EventPublisher, Arc<std::sync::Mutex<Vec<Seen>>>) {
        publisher_answering(cfg, vec![])
    }

    fn publisher_answering(
        cfg: EventConfig,
        replies: Vec<Reply>,
    ) -> (EventPublisher, Arc<std::sync::Mutex<Vec<Seen>>>) {
        let (client, handle) = client();
        let seen = serve(handle, replies);
        let reporter = Reporter {
            controller: "observer".into(),
            instance: Some("node-1".into()),
        };
        let (p, worker) = EventPublisher::new(client, reporter, cfg, "");
        tokio::spawn(worker);
        (p, seen)
    }

    #[tokio::test(start_paused = true)]
    async fn an_event_waits_out_an_api_outage_and_is_published_once() {
        let (mut p, seen) = publisher_answering(
            EventConfig::default(),
            vec![
                status(503, "ServiceUnavailable"),
                status(429, "TooManyRequests"),
                status(500, "InternalError"),
            ],
        );
        assert!(p.publish(&pod_ref(), &kill(4100, "hog")));
        let s = wait_for(&seen, 4, Duration::from_secs(30)).await;
        assert_eq!(s.len(), 4, "three failures, then the Event");
        let st = p.stats();
        wait_until(|| st.pending.load(Ordering::Relaxed) == 0).await;
        assert_eq!(
            st.snapshot()[..4],
            [1, 1, 0, 3],
            "queued, published, failed, retried"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_event_the_api_refuses_is_dropped_not_retried() {
        let (mut p, seen) =
            publisher_answering(EventConfig::default(), vec![status(422, "Invalid")]);
        assert!(p.publish(&pod_ref(), &kill(4100, "hog")));
        let st = p.stats();
        wait_until(|| st.pending.load(Ordering::Relaxed) == 0).await;
        assert_eq!(st.snapshot()[..4], [1, 0, 1, 0]);
        assert_eq!(seen.lock().unwrap().len(), 1);
    }

    /// A server whose first Event create never answers, having `landed` it or not; a list of
    /// Events answers what was created.
    fn publisher_losing_first_answer(
        landed: bool,
    ) -> (EventPublisher, Arc<std::sync::Mutex<Vec<Seen>>>) {
        let (client, mut handle) = client();
        let seen: Arc<std::sync::Mutex<Vec<Seen>>> = Arc::default();
        let log = Arc::clone(&seen);
        tokio::spawn(async move {
            let mut created: Vec<serde_json::Value> = Vec::new();
            let mut held = Vec::new();
            let mut posts = 0;
            while let Some((req, send)) = handle.next_request().await {
                let s = read(req).await;
                log.lock().unwrap().push(s.clone());
                let reply = if s.method == http::Method::GET {
                    Reply::Json(
                        200,
                        serde_json::json!({"apiVersion": "events.k8s.io/v1", "kind": "EventList",
                            "metadata": {"resourceVersion": "1"}, "items": created}),
                    )
                } else {
                    posts += 1;
                    if posts > 1 || landed {
                        created.push(s.body.clone());
                    }
                    if posts == 1 {
                        Reply::Hang
                    } else {
                        Reply::Json(201, s.body.clone())
                    }
                };
                match response(&reply) {
                    Some(r) => send.send_response(r),
                    None => held.push(send),
                }
            }
        });
        let reporter = Reporter {
            controller: "observer".into(),
            instance: Some("node-1".into()),
        };
        let (p, worker) = EventPublisher::new(client, reporter, EventConfig::default(), "");
        tokio::spawn(worker);
        (p, seen)
    }

    /// Publishes one Event on [`publisher_losing_first_answer`]: (creates sent, creates found
    /// landed), once it was published.
    async fn creates_when_the_first_answer_is_lost(landed: bool) -> (usize, u64) {
        let (mut p, seen) = publisher_losing_first_answer(landed);
        assert!(p.publish(&pod_ref(), &kill(4100, "hog")));
        let st = p.stats();
        wait_until(|| st.pending.load(Ordering::Relaxed) == 0).await;
        assert_eq!(st.snapshot()[..3], [1, 1, 0], "queued, published, failed");
        let posts = seen
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.method == http::Method::POST)
            .count();
        (posts, st.landed_unanswered.load(Ordering::Relaxed))
    }

    #[tokio::test(start_paused = true)]
    async fn a_create_whose_answer_never_came_but_landed_is_not_created_again() {
        assert_eq!(creates_when_the_first_answer_is_lost(true).await, (1, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_create_whose_answer_never_came_and_that_did_not_land_is_sent_again() {
        assert_eq!(creates_when_the_first_answer_is_lost(false).await, (2, 0));
    }

    #[test]
    fn only_a_new_event_of_the_same_kind_since_the_attempt_was_created_by_it() {
        let event = Event {
            type_: EventType::Warning,
            reason: "ContainerDiedOOMKilled".into(),
            note: None,
            action: "Signal/9".into(),
            secondary: None,
        };
        let at = SystemTime::now();
        let made = |action: &str, reason: &str, t: SystemTime, series: bool| {
            let mut e = K8sEvent {
                action: Some(action.into()),
                reason: Some(reason.into()),
                event_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                    t.try_into().unwrap(),
                )),
                ..Default::default()
            };
            if series {
                e.series = Some(k8s_openapi::api::events::v1::EventSeries {
                    count: 2,
                    last_observed_time: e.event_time.clone().unwrap(),
                });
            }
            e
        };
        let later = at + Duration::from_millis(3);
        assert!(created_since(
            &made("Signal/9", "ContainerDiedOOMKilled", later, false),
            &event,
            at
        ));
        assert!(
            !created_since(
                &made(
                    "Signal/9",
                    "ContainerDiedOOMKilled",
                    at - Duration::from_secs(2),
                    false
                ),
                &event,
                at
            ),
            "an earlier death's"
        );
        assert!(
            !created_since(
                &made("Exit/1", "ContainerDiedOOMKilled", later, false),
                &event,
                at
            ),
            "another exit"
        );
        assert!(
            !created_since(
                &made("Signal/9", "ContainerDiedError", later, false),
                &event,
                at
            ),
            "another reason"
        );
        assert!(
            !created_since(
                &made("Signal/9", "ContainerDiedOOMKilled", later, true),
                &event,
                at
            ),
            "a series"
        );
    }

    async fn wait_until(mut ok: impl FnMut() -> bool) {
        for _ in 0..3000 {
            if ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("not within 60 s");
    }

    #[tokio::test(start_paused = true)]
    async fn each_oom_victim_is_its_own_event_with_its_own_note() {
        let (mut p, seen) = publisher(EventConfig::default());
        assert!(p.publish(&pod_ref(), &kill(4100, "hog")));
        assert!(p.publish(&pod_ref(), &kill(4200, "worker")));
        let s = wait_for(&seen, 2, Duration::from_secs(5)).await;
        assert_eq!(s.len(), 2);
        for (req, (pid, comm)) in s.iter().zip([(4100, "hog"), (4200, "worker")]) {
            assert_eq!(
                req.method,
                http::Method::POST,
                "a new event, not a series bump"
            );
            assert_eq!(req.path, "/apis/events.k8s.io/v1/namespaces/default/events");
            assert_eq!(req.content_type, "application/json");
            let e: K8sEvent = serde_json::from_value(req.body.clone()).unwrap();
            assert_eq!(e.type_.as_deref(), Some("Warning"));
            assert_eq!(e.reason.as_deref(), Some("ProcessOOMKilled"));
            assert_eq!(e.reporting_controller.as_deref(), Some("observer"));
            assert_eq!(e.reporting_instance.as_deref(), Some("node-1"));
            let r = e.regarding.unwrap();
            assert_eq!(
                (
                    r.kind.as_deref(),
                    r.name.as_deref(),
                    r.uid.as_deref(),
                    r.field_path.as_deref()
                ),
                (
                    Some("Pod"),
                    Some(NAME),
                    Some(UID),
                    Some("spec.containers{app}")
                )
            );
            let note = e.note.unwrap();
            assert!(
                note.contains(&format!("process {comm} (pid {pid})")),
                "{note}"
            );
            assert!(
                note.contains("limit 64Mi") && note.contains("survived"),
                "{note}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_same_death_again_is_a_series_of_one_event() {
        let (mut p, seen) = publisher(EventConfig::default());
        let died = PodEvent::ContainerDied {
            container: "app".into(),
            init_container: false,
            exit_code: Some(1),
            signal: None,
            reason: Some("Error".into()),
            kernel_seen: true,
            late: None,
        };
        assert!(p.publish(&pod_ref(), &died));
        wait_for(&seen, 1, Duration::from_secs(5)).await;
        assert!(p.publish(&pod_ref(), &died));
        let s = wait_for(&seen, 2, Duration::from_secs(5)).await;
        assert_eq!(s[0].method, http::Method::POST);
        assert_eq!(s[1].method, http::Method::PATCH);
        assert_eq!(s[1].content_type, "application/merge-patch+json");
        let e: K8sEvent = serde_json::from_value(s[1].body.clone()).unwrap();
        assert_eq!(e.series.unwrap().count, 2);
        assert_eq!(
            e.note.as_deref(),
            Some("container app exited with code 1: Error (seen by the kernel)")
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_pod_is_rate_limited_and_refills() {
        let cfg = EventConfig {
            burst: 3,
            refill: Duration::from_secs(10),
            ..Default::default()
        };
        let (mut p, _seen) = publisher(cfg);
        let accepted = (0..10)
            .filter(|i| p.publish(&pod_ref(), &kill(5000 + i, "x")))
            .count();
        assert_eq!(accepted, 3);
        assert_eq!(p.stats().rate_limited.load(Ordering::Relaxed), 7);
        // Another pod has its own budget.
        let other = PodRef {
            uid: "other".into(),
            ..pod_ref()
        };
        assert!(p.publish(&other, &kill(1, "y")));
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(
            p.publish(&pod_ref(), &kill(6000, "z")),
            "one token back after the period"
        );
        assert!(!p.publish(&pod_ref(), &kill(6001, "z")));
        p.forget("other");
        assert_eq!(p.tracked_pods(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn memory_is_bounded_in_pods_and_queue() {
        let cfg = EventConfig {
            max_pods: 4,
            queue: 2,
            ..Default::default()
        };
        let (client, _handle) = client(); // nobody answers: the queue fills
        let (mut p, _worker) = EventPublisher::new(client, "observer".into(), cfg, "");
        for i in 0..100 {
            let pod = PodRef {
                uid: format!("pod-{i}"),
                ..pod_ref()
            };
            p.publish(&pod, &kill(i, "x"));
        }
        assert!(p.tracked_pods() <= 4);
        let s = p.stats();
        assert_eq!(s.queued.load(Ordering::Relaxed), 2);
        assert_eq!(s.overflow.load(Ordering::Relaxed), 98);
    }
}
