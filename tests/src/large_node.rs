//! A large node under faults, on the real cluster's host node: a fleet of pods of several shapes
//! (half gated on the agent's `ContainersAlive`), a churn that kills containers at a fixed rate
//! and replaces pods, the faults a node sees, and the account of every death from ground truth
//! taken apart from the agent.
//!
//! - **Ground truth**: the churn kills each container itself (SIGKILL to its init, found in
//!   /proc by the container id kubelet reported): a death is a kill(2) that succeeded, with its
//!   wall time. Nothing the agent says decides what died.
//! - **What the agent said**: its status writes, from the API server's audit log (each write's
//!   body and when it completed: what reached the API, whatever a watch would have missed while
//!   the API server was away), and its Events as the API keeps them at the end (a death's Event
//!   folds repeats into a series: its count is the deaths it told).
//!
//! Shared by the CI test (`tests/tests/real_cluster/large_node.rs`, 60 pods) and the benchmark
//! (`tests/benches/large_node.rs`, 250 pods).
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{anyhow, bail, Result};
use serde_json::Value;

pub use crate::bench::pct;
pub use crate::cluster::audit_events;
use crate::cluster::{
    condition, container_pid, Cluster, TestPod, AGENT_ADDR, AGENT_NAMESPACE, AGENT_USER, NODE_NAME,
    POLL,
};
use crate::wait::poll_every;

pub const ALIVE: &str = "observer.dev/ContainersAlive";
/// kubelet's user on the host's node.
pub const KUBELET_USER: &str = "system:node:observer-node";
/// A container is killed only once kubelet has reported it running this long: the agent and
/// kubelet both know it.
const MIN_RUNNING: Duration = Duration::from_secs(3);

/// The pods' shapes, in turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Shape {
    /// One container.
    Single,
    /// An init container that completes, then the main one.
    InitMain,
    /// A native sidecar (an init container that restarts always) beside the main one.
    Sidecar,
    /// Two containers under a pod-level memory limit.
    PodLimit,
}

impl Shape {
    pub const ALL: [Shape; 4] = [
        Shape::Single,
        Shape::InitMain,
        Shape::Sidecar,
        Shape::PodLimit,
    ];

    /// The containers the churn kills (those that run until killed).
    pub fn killable(self) -> &'static [&'static str] {
        match self {
            Shape::Single | Shape::InitMain => &["main"],
            Shape::Sidecar => &["main", "side"],
            Shape::PodLimit => &["main", "helper"],
        }
    }

    fn pod(self, name: &str, ns: &str, gated: bool) -> TestPod {
        let run = "exec sleep 100000";
        let mut p = TestPod::new(name, ns, "Always").label("fleet", "large-node");
        p = match self {
            Shape::Single => p.container("main", run),
            Shape::InitMain => p
                .init_container("setup", "exit 0", None)
                .container("main", run),
            Shape::Sidecar => p.sidecar("side", run).container("main", run),
            Shape::PodLimit => p
                .pod_memory_limit("64Mi")
                .container("main", run)
                .container("helper", run),
        };
        if gated {
            p = p.readiness_gate(ALIVE);
        }
        p
    }
}

/// One pod of the fleet.
#[derive(Clone, Debug)]
pub struct FleetPod {
    pub name: String,
    pub shape: Shape,
    pub gated: bool,
}

/// The fleet's pods, in a namespace of the caller's.
#[derive(Clone, Debug)]
pub struct Fleet {
    pub ns: String,
    pub pods: Vec<FleetPod>,
}

impl Fleet {
    /// `n` pods, the shapes in turn and every other one gated, applied `wave` at a time; returns
    /// once all are Ready (the gated ones by the agent's condition too), or fails at `deadline`.
    pub fn start(c: &Cluster, ns: &str, n: usize, wave: usize, deadline: Duration) -> Result<Self> {
        let pods: Vec<FleetPod> = (0..n)
            .map(|i| FleetPod {
                name: format!("big-{i:03}"),
                shape: Shape::ALL[i % Shape::ALL.len()],
                gated: i % 2 == 0,
            })
            .collect();
        let started = Instant::now();
        for chunk in pods.chunks(wave.max(1)) {
            apply_all(
                c,
                chunk
                    .iter()
                    .map(|p| p.shape.pod(&p.name, ns, p.gated).manifest()),
            )?;
            let left = deadline.saturating_sub(started.elapsed());
            wait_ready(c, ns, chunk.iter().map(|p| p.name.as_str()), left)?;
        }
        Ok(Self {
            ns: ns.into(),
            pods,
        })
    }
}

/// `kubectl apply` of many manifests as one List.
pub fn apply_all(c: &Cluster, manifests: impl Iterator<Item = String>) -> Result<()> {
    let items: Vec<Value> = manifests
        .map(|m| serde_json::from_str(&m))
        .collect::<Result<_, _>>()?;
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items});
    crate::cluster::apply(c, &list.to_string())
}

/// The namespace's pods (`kubectl get`, at most 20 s).
pub fn list_pods(c: &Cluster, ns: &str) -> Result<Vec<Value>> {
    let out = c.kubectl_ok(&[
        "get",
        "pods",
        "-n",
        ns,
        "-o",
        "json",
        "--request-timeout=20s",
    ])?;
    let v: Value = serde_json::from_str(&out)?;
    Ok(v["items"].as_array().cloned().unwrap_or_default())
}

fn is_ready(p: &Value) -> bool {
    condition(p, "Ready").is_some_and(|r| r["status"] == "True")
}

/// Waits until every named pod is Ready.
pub fn wait_ready<'a>(
    c: &Cluster,
    ns: &str,
    names: impl Iterator<Item = &'a str>,
    timeout: Duration,
) -> Result<()> {
    let names: HashSet<&str> = names.collect();
    let mut missing = names.len();
    poll_every(Duration::from_secs(1), timeout, || {
        let pods = list_pods(c, ns).ok()?;
        let ready = pods
            .iter()
            .filter(|p| {
                p["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| names.contains(n))
            })
            .filter(|p| is_ready(p))
            .count();
        missing = names.len() - ready;
        (missing == 0).then_some(())
    })
    .ok_or_else(|| {
        anyhow!(
            "{missing} of {} pods not Ready within {timeout:?}",
            names.len()
        )
    })
}

/// One death the churn caused.
#[derive(Clone, Debug)]
pub struct Death {
    pub pod: String,
    pub container: String,
    pub container_id: String,
    pub at: SystemTime,
    pub gated: bool,
}

/// The churn's pace.
#[derive(Clone, Copy, Debug)]
pub struct ChurnConfig {
    pub deaths_per_sec: f64,
    /// A pod deleted and replaced by a new one of the same shape this often (a rolling
    /// replacement), or never.
    pub replace_every: Option<Duration>,
}

#[derive(Default)]
struct ChurnState {
    deaths: Vec<Death>,
    /// Pods deleted by the replacement: left out of the account (kubelet's kills at deletion are
    /// deaths the churn did not cause).
    replaced: Vec<String>,
    /// The fleet as it is now.
    pods: Vec<FleetPod>,
    /// Ticks with no container to kill (all dead, not yet reported running, or the API away).
    no_victim: u64,
    paused: bool,
}

/// The churn, in a thread of its own until stopped.
pub struct Churn {
    stop: Arc<AtomicBool>,
    state: Arc<Mutex<ChurnState>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What the churn did.
#[derive(Clone, Debug, Default)]
pub struct ChurnLog {
    pub deaths: Vec<Death>,
    pub replaced: Vec<String>,
    pub pods: Vec<FleetPod>,
    pub no_victim: u64,
}

impl Churn {
    pub fn start(c: &Cluster, fleet: &Fleet, cfg: ChurnConfig) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let state = Arc::new(Mutex::new(ChurnState {
            pods: fleet.pods.clone(),
            ..Default::default()
        }));
        let (c, ns, s, st) = (c.clone(), fleet.ns.clone(), stop.clone(), state.clone());
        let thread = std::thread::spawn(move || churn(&c, &ns, cfg, &s, &st));
        Self {
            stop,
            state,
            thread: Some(thread),
        }
    }

    /// Stops killing (replacements too) until [`Churn::resume`]: a quiet moment to take stock.
    pub fn pause(&self) {
        lock(&self.state).paused = true;
    }

    pub fn resume(&self) {
        lock(&self.state).paused = false;
    }

    /// Deaths caused beside the churn (a fault's burst of kills): part of the ground truth.
    pub fn record(&self, deaths: impl IntoIterator<Item = Death>) {
        lock(&self.state).deaths.extend(deaths);
    }

    /// The deaths so far.
    pub fn log(&self) -> ChurnLog {
        let s = lock(&self.state);
        ChurnLog {
            deaths: s.deaths.clone(),
            replaced: s.replaced.clone(),
            pods: s.pods.clone(),
            no_victim: s.no_victim,
        }
    }

    pub fn stop(mut self) -> ChurnLog {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.log()
    }
}

impl Drop for Churn {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn churn(c: &Cluster, ns: &str, cfg: ChurnConfig, stop: &AtomicBool, state: &Mutex<ChurnState>) {
    let period = Duration::from_secs_f64(1.0 / cfg.deaths_per_sec.max(0.01));
    let mut rng = fastrand::Rng::with_seed(34);
    let mut listing: Vec<Value> = Vec::new();
    let mut listed_at: Option<Instant> = None;
    let mut killed: HashSet<String> = HashSet::new();
    let mut next = Instant::now();
    let mut next_replace = cfg.replace_every.map(|e| Instant::now() + e);
    let mut replacements = 0usize;
    while !stop.load(Ordering::Relaxed) {
        if Instant::now() < next {
            std::thread::sleep((next - Instant::now()).min(Duration::from_millis(50)));
            continue;
        }
        next += period;
        if lock(state).paused {
            continue;
        }
        // The pods as kubelet reports them, at most 2 s old (kept as they were while the API
        // is away: a killed container's successor is then unknown, so not killed).
        if listed_at.is_none_or(|t| t.elapsed() > Duration::from_secs(2)) {
            if let Ok(l) = list_pods(c, ns) {
                listing = l;
                listed_at = Some(Instant::now());
            }
        }
        if let (Some(at), Some(every)) = (next_replace, cfg.replace_every) {
            if Instant::now() >= at {
                next_replace = Some(Instant::now() + every);
                replacements += 1;
                replace_one(c, ns, state, &mut rng, replacements);
            }
        }
        let pods = lock(state).pods.clone();
        let by_name: HashMap<&str, &FleetPod> = pods.iter().map(|p| (p.name.as_str(), p)).collect();
        let now = SystemTime::now();
        let mut candidates = Vec::new();
        for p in &listing {
            let Some(fp) = p["metadata"]["name"].as_str().and_then(|n| by_name.get(n)) else {
                continue;
            };
            if !p["metadata"]["deletionTimestamp"].is_null() {
                continue;
            }
            let statuses = ["containerStatuses", "initContainerStatuses"]
                .iter()
                .flat_map(|k| p["status"][k].as_array().cloned().unwrap_or_default());
            for s in statuses {
                let name = s["name"].as_str().unwrap_or_default();
                let Some(id) = s["containerID"].as_str() else {
                    continue;
                };
                let started = s["state"]["running"]["startedAt"]
                    .as_str()
                    .and_then(parse_time);
                let settled = started
                    .is_some_and(|t| now.duration_since(t).unwrap_or_default() >= MIN_RUNNING);
                if fp.shape.killable().contains(&name) && settled && !killed.contains(id) {
                    candidates.push((fp.name.clone(), name.to_string(), id.to_string(), fp.gated));
                }
            }
        }
        let mut done = false;
        for _ in 0..candidates.len().min(5) {
            let (pod, container, id, gated) = candidates.swap_remove(rng.usize(..candidates.len()));
            killed.insert(id.clone());
            let Ok(pid) = container_pid(&id) else {
                continue;
            };
            // Killed and recorded under the lock, and not once paused: an account that paused
            // the churn and read its log has every death made before, and none after.
            let mut st = lock(state);
            if st.paused {
                done = true;
                break;
            }
            let at = SystemTime::now();
            if nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            )
            .is_ok()
            {
                st.deaths.push(Death {
                    pod,
                    container,
                    container_id: id,
                    at,
                    gated,
                });
                done = true;
                break;
            }
        }
        if !done {
            lock(state).no_victim += 1;
        }
    }
}

/// Deletes a pod that had no death in the last 30 s (its account is complete) and creates one of
/// the same shape under a new name.
fn replace_one(
    c: &Cluster,
    ns: &str,
    state: &Mutex<ChurnState>,
    rng: &mut fastrand::Rng,
    n: usize,
) {
    let (old, new) = {
        let s = lock(state);
        let recent: HashSet<&str> = s
            .deaths
            .iter()
            .filter(|d| d.at.elapsed().unwrap_or_default() < Duration::from_secs(30))
            .map(|d| d.pod.as_str())
            .collect();
        let choices: Vec<&FleetPod> = s
            .pods
            .iter()
            .filter(|p| !recent.contains(p.name.as_str()))
            .collect();
        if choices.is_empty() {
            return;
        }
        let old = choices[rng.usize(..choices.len())].clone();
        let base = old.name.split("-r").next().unwrap_or(&old.name).to_string();
        let new = FleetPod {
            name: format!("{base}-r{n}"),
            ..old.clone()
        };
        (old, new)
    };
    if c.kubectl_ok(&[
        "delete",
        "pod",
        &old.name,
        "-n",
        ns,
        "--wait=false",
        "--request-timeout=20s",
    ])
    .is_err()
    {
        return;
    }
    let mut s = lock(state);
    s.pods.retain(|p| p.name != old.name);
    s.replaced.push(old.name.clone());
    if crate::cluster::apply(c, &new.shape.pod(&new.name, ns, new.gated).manifest()).is_ok() {
        s.pods.push(new);
    }
}

/// An RFC 3339 time of the API (`2026-12-04T10:00:00Z`, or with fractions as the audit log has).
pub fn parse_time(s: &str) -> Option<SystemTime> {
    time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
        .ok()
        .map(SystemTime::from)
}

/// One status write the API server completed.
#[derive(Clone, Debug)]
pub struct Write {
    pub received: SystemTime,
    pub completed: SystemTime,
    /// The status the patch gives the condition looked for (the agent's: ContainersAlive), if
    /// the patch has it.
    pub alive: Option<String>,
    /// The conditions the patch sets, whole (transition times included), sorted: a write equal
    /// to the previous one changes nothing.
    pub signature: String,
}

/// The agent's completed status writes to `ns`'s pods, per pod, in order.
pub fn agent_writes(audit: &[Value], ns: &str) -> BTreeMap<String, Vec<Write>> {
    status_writes_by(audit, ns, AGENT_USER, ALIVE)
}

/// `user`'s completed status writes to `ns`'s pods, per pod, in order; [`Write::alive`] is the
/// status each gives condition `ty`.
pub fn status_writes_by(
    audit: &[Value],
    ns: &str,
    user: &str,
    ty: &str,
) -> BTreeMap<String, Vec<Write>> {
    let mut out: BTreeMap<String, Vec<Write>> = BTreeMap::new();
    for e in audit {
        let ok = e["stage"] == "ResponseComplete"
            && e["user"]["username"] == user
            && e["objectRef"]["resource"] == "pods"
            && e["objectRef"]["subresource"] == "status"
            && e["objectRef"]["namespace"] == ns
            && e["responseStatus"]["code"]
                .as_u64()
                .is_some_and(|c| (200..300).contains(&c));
        if !ok {
            continue;
        }
        let (Some(received), Some(completed)) = (
            e["requestReceivedTimestamp"].as_str().and_then(parse_time),
            e["stageTimestamp"].as_str().and_then(parse_time),
        ) else {
            continue;
        };
        let conds = e["requestObject"]["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let alive = conds
            .iter()
            .find(|c| c["type"] == ty)
            .and_then(|c| c["status"].as_str().map(String::from));
        let mut sig: Vec<String> = conds.iter().map(Value::to_string).collect();
        sig.sort();
        let pod = e["objectRef"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        out.entry(pod).or_default().push(Write {
            received,
            completed,
            alive,
            signature: sig.join(","),
        });
    }
    for w in out.values_mut() {
        w.sort_by_key(|w| w.received);
    }
    out
}

/// The agent's death Events about `pod`'s `container`, a line each (when, reason, series count,
/// the note's start): what a duplicate is made of.
pub fn agent_death_events_of(
    c: &Cluster,
    ns: &str,
    pod: &str,
    container: &str,
) -> Result<Vec<String>> {
    let out = c.kubectl_ok(&[
        "get",
        "events.events.k8s.io",
        "-n",
        ns,
        "--field-selector",
        &format!("regarding.name={pod}"),
        "-o",
        "json",
        "--request-timeout=60s",
    ])?;
    let v: Value = serde_json::from_str(&out)?;
    let mut lines: Vec<String> = v["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| {
            e["reportingController"] == "observer"
                && e["reason"]
                    .as_str()
                    .is_some_and(|r| r.starts_with("ContainerDied"))
                && e["regarding"]["fieldPath"]
                    .as_str()
                    .is_some_and(|p| p.ends_with(&format!("{{{container}}}")))
        })
        .map(|e| {
            let note: String = e["note"]
                .as_str()
                .unwrap_or_default()
                .chars()
                .take(120)
                .collect();
            format!(
                "{} {} (instance {}) count {} last {}: {note}",
                e["eventTime"].as_str().unwrap_or_default(),
                e["reason"].as_str().unwrap_or_default(),
                e["reportingInstance"].as_str().unwrap_or_default(),
                e["series"]["count"].as_u64().unwrap_or(1),
                e["series"]["lastObservedTime"].as_str().unwrap_or("-"),
            )
        })
        .collect();
    lines.sort();
    Ok(lines)
}

/// Deaths told by Events, per (pod, container).
pub type EventCounts = HashMap<(String, String), u64>;

/// The agent's death Events in `ns` as the API has them: the deaths each told (a series'
/// count), per (pod, container); and how many of them were told late.
pub fn agent_death_events(c: &Cluster, ns: &str) -> Result<(EventCounts, u64)> {
    let out = c.kubectl_ok(&[
        "get",
        "events.events.k8s.io",
        "-n",
        ns,
        "-o",
        "json",
        "--request-timeout=60s",
    ])?;
    let v: Value = serde_json::from_str(&out)?;
    let mut told = HashMap::new();
    let mut late = 0;
    for e in v["items"].as_array().into_iter().flatten() {
        let reason = e["reason"].as_str().unwrap_or_default();
        // The churn's deaths are SIGKILLs: ContainerDied<reason>. An init container's
        // completion (ContainerCompleted) is not one.
        if e["reportingController"] != "observer" || !reason.starts_with("ContainerDied") {
            continue;
        }
        let pod = e["regarding"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let path = e["regarding"]["fieldPath"].as_str().unwrap_or_default();
        let container = path
            .split_once('{')
            .map(|(_, c)| c.trim_end_matches('}').to_string())
            .unwrap_or_default();
        let n = e["series"]["count"].as_u64().unwrap_or(1);
        if e["note"].as_str().is_some_and(|n| n.contains("told late")) {
            late += n;
        }
        *told.entry((pod, container)).or_default() += n;
    }
    Ok((told, late))
}

/// A fault over a span of wall time.
#[derive(Clone, Debug)]
pub struct Span {
    pub start: SystemTime,
    pub end: SystemTime,
}

impl Span {
    pub fn holds(&self, t: SystemTime) -> bool {
        t >= self.start && t <= self.end
    }
}

/// The agent's per-request timeout (the default, which the test cluster's agent keeps): a write
/// the server took this long over was given up on by the agent and sent again.
fn agent_request_timeout() -> Duration {
    observer::status::StatusConfig::new("", observer::status::StatusMode::Conditions)
        .request_timeout
}

/// What the agent's clock may have run before the server's received the request (a connection
/// to open, a slot in the pipeline).
const UNANSWERED_SLACK: Duration = Duration::from_secs(1);

/// When the API server received a write, and when it completed it.
pub type WriteTimes = (SystemTime, SystemTime);

/// A death the status never told: (seconds since the epoch, the index of the fault it fell in).
pub type UntoldDeath = (f64, Option<usize>);

/// The account of a window of churn: every death the churn caused in it, against what the agent
/// wrote and published.
#[derive(Clone, Debug, Default)]
pub struct Account {
    pub deaths: usize,
    pub during_fault: usize,
    /// Deaths whose pod's ContainersAlive was False in the API after the death (the next write
    /// of the condition after it set False, or it already stood False from another container's
    /// death).
    pub told_in_status: usize,
    /// Deaths an Event told (per pod and container: at most the deaths there).
    pub told_by_event: u64,
    /// Events that told a death late, from the runtime's record.
    pub told_late: u64,
    /// Deaths neither in the status nor in an Event.
    pub lost: u64,
    /// Where they were: (pod, container, Events there against deaths there, the deaths the
    /// status never told as (seconds since the epoch, the fault they fell in)).
    pub lost_where: Vec<(String, String, String, Vec<UntoldDeath>)>,
    /// Deaths with no Event (whether or not the status told them).
    pub events_missing: u64,
    /// Where they were: (pod, container, the churn's deaths there, deaths the Events told).
    pub missing: Vec<(String, String, u64, u64)>,
    /// Events beyond the deaths of their container.
    pub duplicate_events: u64,
    /// Where they were: (pod, container, the churn's deaths there, deaths the Events told).
    pub duplicated: Vec<(String, String, u64, u64)>,
    /// Status writes that changed none of the agent's conditions, sent after the previous one
    /// was answered: the agent knew it had written that.
    pub duplicate_writes: usize,
    /// The same, sent again before the previous one's answer could reach the agent (that one
    /// outlived the agent's request timeout at the server, or was still running there): a
    /// retry of a request that seemed lost, a no-op on the server.
    pub resent_unanswered: usize,
    /// Where they were: (pod, the two writes' (received, completed) times, the signature).
    pub duplicate_writes_where: Vec<(String, [WriteTimes; 2], String)>,
    /// Delays from the death to its False in the API, in ms (0: already False), sorted.
    pub delays_ms: Vec<f64>,
    /// For deaths during a fault: from the fault's end to the False in the API (0 if before).
    pub after_fault_ms: Vec<f64>,
    /// The three slowest deaths to their False: (ms, pod, container).
    pub slowest: Vec<(f64, String, String)>,
    /// Pods left with ContainersAlive True while kubelet says a container is not running, once
    /// both settled (see [`settle`]).
    pub stale: Vec<String>,
}

impl Account {
    /// The account in one line.
    pub fn summary(&self) -> String {
        format!(
            "{} deaths ({} during a fault); told in status {}, by an Event {} ({} late); lost {}, Events missing {}, duplicate Events {}, duplicate writes {} (and {} resent unanswered); death → False p50 {:.0} ms p99 {:.0} ms (slowest {:?}); after a fault's end max {:.0} ms; stale {:?}",
            self.deaths,
            self.during_fault,
            self.told_in_status,
            self.told_by_event,
            self.told_late,
            self.lost,
            self.events_missing,
            self.duplicate_events,
            self.duplicate_writes,
            self.resent_unanswered,
            pct(&self.delays_ms, 50.0),
            pct(&self.delays_ms, 99.0),
            self.slowest,
            self.after_fault_ms.last().copied().unwrap_or(0.0),
            self.stale,
        )
    }
}

/// Accounts for `deaths` (those at or after `since`) with the agent's writes since then and the
/// Events' counts before (`events_before`) and now (`events_after`).
pub fn account(
    deaths: &[Death],
    excluded: &HashSet<String>,
    writes: &BTreeMap<String, Vec<Write>>,
    events_before: &EventCounts,
    events_after: &EventCounts,
    late: u64,
    faults: &[Span],
) -> Account {
    let mut a = Account {
        told_late: late,
        ..Default::default()
    };
    let mut per_pair: HashMap<(String, String), (u64, u64)> = HashMap::new();
    let mut untold_at: HashMap<(String, String), Vec<UntoldDeath>> = HashMap::new();
    for d in deaths.iter().filter(|d| !excluded.contains(&d.pod)) {
        a.deaths += 1;
        let fault_index = faults.iter().position(|f| f.holds(d.at));
        let fault = fault_index.map(|i| &faults[i]);
        if fault.is_some() {
            a.during_fault += 1;
        }
        let pod_writes = writes.get(&d.pod).map(Vec::as_slice).unwrap_or_default();
        let standing_false = pod_writes
            .iter()
            .rfind(|w| w.alive.is_some() && w.completed <= d.at)
            .is_some_and(|w| w.alive.as_deref() == Some("False"));
        let told = if standing_false {
            Some(d.at)
        } else {
            // The next write that sets the condition after the death: False tells it; True
            // means the container ran again before a False reached the API (the API away, or
            // the agent down) and the status never showed this death.
            // A write after the pod's next death belongs to that one.
            let next = deaths
                .iter()
                .filter(|n| n.pod == d.pod && n.at > d.at)
                .map(|n| n.at)
                .min();
            pod_writes
                .iter()
                .find(|w| w.received >= d.at && w.alive.is_some())
                .filter(|w| w.alive.as_deref() == Some("False"))
                .filter(|w| next.is_none_or(|n| w.received < n))
                .map(|w| w.completed)
        };
        let pair = per_pair
            .entry((d.pod.clone(), d.container.clone()))
            .or_default();
        pair.0 += 1;
        match told {
            Some(t) => {
                a.told_in_status += 1;
                let ms = |from: SystemTime| {
                    t.duration_since(from).unwrap_or_default().as_secs_f64() * 1e3
                };
                a.delays_ms.push(ms(d.at));
                a.slowest
                    .push((ms(d.at), d.pod.clone(), d.container.clone()));
                if let Some(f) = fault {
                    a.after_fault_ms.push(ms(f.end));
                }
            }
            None => {
                pair.1 += 1;
                let secs =
                    d.at.duration_since(SystemTime::UNIX_EPOCH)
                        .unwrap_or_default()
                        .as_secs_f64();
                untold_at
                    .entry((d.pod.clone(), d.container.clone()))
                    .or_default()
                    .push((secs, fault_index));
            }
        }
    }
    for ((pod, container), (deaths, untold)) in &per_pair {
        let key = (pod.clone(), container.clone());
        let told = events_after.get(&key).copied().unwrap_or(0)
            - events_before
                .get(&key)
                .copied()
                .unwrap_or(0)
                .min(events_after.get(&key).copied().unwrap_or(0));
        a.told_by_event += told.min(*deaths);
        a.events_missing += deaths.saturating_sub(told);
        if told < *deaths {
            a.missing
                .push((pod.clone(), container.clone(), *deaths, told));
        }
        a.duplicate_events += told.saturating_sub(*deaths);
        if told > *deaths {
            a.duplicated
                .push((pod.clone(), container.clone(), *deaths, told));
        }
        let lost = deaths.saturating_sub(told).min(*untold);
        a.lost += lost;
        if lost > 0 {
            a.lost_where.push((
                pod.clone(),
                container.clone(),
                format!("{told} Events for {deaths} deaths"),
                untold_at.remove(&key).unwrap_or_default(),
            ));
        }
    }
    for (pod, ws) in writes {
        if excluded.contains(pod) {
            continue;
        }
        for w in ws.windows(2).filter(|w| w[0].signature == w[1].signature) {
            let slow = w[0]
                .completed
                .duration_since(w[0].received)
                .is_ok_and(|d| d + UNANSWERED_SLACK >= agent_request_timeout());
            if slow || w[1].received < w[0].completed {
                a.resent_unanswered += 1;
                continue;
            }
            a.duplicate_writes += 1;
            a.duplicate_writes_where.push((
                pod.clone(),
                [
                    (w[0].received, w[0].completed),
                    (w[1].received, w[1].completed),
                ],
                w[1].signature.clone(),
            ));
        }
    }
    a.delays_ms.sort_by(f64::total_cmp);
    a.after_fault_ms.sort_by(f64::total_cmp);
    a.slowest.sort_by(|x, y| y.0.total_cmp(&x.0));
    a.slowest.truncate(3);
    a
}

/// Whether a pod's kubelet account and the agent's condition agree: every container running and
/// the condition True, or one not running and the condition False. `None` while kubelet has
/// not reported the containers.
fn agrees(p: &Value) -> Option<bool> {
    let statuses: Vec<Value> = ["containerStatuses", "initContainerStatuses"]
        .iter()
        .flat_map(|k| p["status"][k].as_array().cloned().unwrap_or_default())
        // A completed init container is not a death.
        .filter(|s| s["state"]["terminated"]["reason"] != "Completed")
        .collect();
    if statuses.is_empty() {
        return None;
    }
    let all_running = statuses.iter().all(|s| !s["state"]["running"].is_null());
    let alive = condition(p, ALIVE)?["status"].as_str()? == "True";
    Some(all_running == alive)
}

/// Waits (up to `timeout`) until every pod of the fleet has kubelet's account and the agent's
/// condition in agreement, and returns the pods with a stale `ContainersAlive=True` (a container
/// kubelet says is not running) left at the end.
pub fn settle(c: &Cluster, ns: &str, pods: &[FleetPod], timeout: Duration) -> Result<Vec<String>> {
    let names: HashSet<&str> = pods.iter().map(|p| p.name.as_str()).collect();
    let mut last = Vec::new();
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(list) = list_pods(c, ns) {
            let ours: Vec<&Value> = list
                .iter()
                .filter(|p| {
                    p["metadata"]["name"]
                        .as_str()
                        .is_some_and(|n| names.contains(n))
                })
                .collect();
            let disagree: Vec<&Value> = ours
                .iter()
                .copied()
                .filter(|p| agrees(p) != Some(true))
                .collect();
            last = disagree
                .iter()
                .filter(|p| condition(p, ALIVE).is_some_and(|a| a["status"] == "True"))
                .map(|p| {
                    p["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string()
                })
                .collect();
            if disagree.is_empty() {
                return Ok(Vec::new());
            }
        }
        if Instant::now() >= deadline {
            return Ok(last);
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// What one user asked of the API server over a window, from the audit log.
#[derive(Clone, Debug, Default)]
pub struct Cost {
    /// Requests by verb (a watch counted when it starts).
    pub by_verb: BTreeMap<String, u64>,
    /// Bytes of the bodies sent (status writes: their patches) and of the pod lists answered.
    pub write_bytes: u64,
    pub list_bytes: u64,
    /// Status writes and Events created or updated.
    pub status_writes: u64,
    pub event_writes: u64,
    /// PodReports applied (server-side apply: one request creates or updates).
    pub report_writes: u64,
}

impl Cost {
    pub fn requests(&self) -> u64 {
        self.by_verb.values().sum()
    }

    pub fn verbs(&self) -> String {
        self.by_verb
            .iter()
            .map(|(v, n)| format!("{v} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The cost of `user`'s requests received in `[from, to)`.
pub fn cost(audit: &[Value], user: &str, from: SystemTime, to: SystemTime) -> Cost {
    let mut c = Cost::default();
    for e in audit {
        if e["user"]["username"] != user {
            continue;
        }
        let Some(t) = e["requestReceivedTimestamp"].as_str().and_then(parse_time) else {
            continue;
        };
        if t < from || t >= to {
            continue;
        }
        let verb = e["verb"].as_str().unwrap_or_default();
        // A watch is logged when it starts and when it ends; anything else once, complete.
        let counted = if verb == "watch" {
            e["stage"] == "ResponseStarted"
        } else {
            e["stage"] == "ResponseComplete"
        };
        if !counted {
            continue;
        }
        *c.by_verb.entry(verb.to_string()).or_default() += 1;
        let resource = e["objectRef"]["resource"].as_str().unwrap_or_default();
        if resource == "pods" && e["objectRef"]["subresource"] == "status" {
            c.status_writes += 1;
        }
        if resource == "events" && matches!(verb, "create" | "update" | "patch") {
            c.event_writes += 1;
        }
        if resource == "podreports" && matches!(verb, "create" | "update" | "patch") {
            c.report_writes += 1;
        }
        if !e["requestObject"].is_null() {
            c.write_bytes += e["requestObject"].to_string().len() as u64;
        }
        if verb == "list" && !e["responseObject"].is_null() {
            c.list_bytes += e["responseObject"].to_string().len() as u64;
        }
    }
    c
}

/// A process's CPU time (utime + stime, seconds), resident set and peak resident set (KiB).
pub fn usage(pid: u32) -> Option<(f64, u64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 (utime, stime) are the 12th and 13th after the command's ")".
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()??
        .max(1) as f64;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
    };
    Some((ticks / hz, kib("VmRSS:")?, kib("VmHWM:")?))
}

/// The agent's process on the host's node (its container's init).
pub fn agent_pid(c: &Cluster) -> Result<u32> {
    let pod = crate::cluster::agent_pod_on(c, NODE_NAME)?;
    let id = pod["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .ok_or_else(|| anyhow!("the agent's pod has no container id yet"))?;
    container_pid(id)
}

/// Whether the agent answers /readyz with 200.
pub fn agent_ready() -> bool {
    let Ok(addr) = AGENT_ADDR.parse() else {
        return false;
    };
    crate::endpoint::http_get(addr, "/readyz").is_some_and(|(code, _)| code == 200)
}

/// The agent SIGKILLed (the DaemonSet's kubelet restarts it): returns the new process's pid and
/// how long it took from that process's start to `/readyz` answering 200.
pub fn kill_agent(c: &Cluster, timeout: Duration) -> Result<(u32, Duration)> {
    let old = agent_pid(c)?;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(old as i32),
        nix::sys::signal::Signal::SIGKILL,
    )?;
    wait_new_agent(c, old, timeout)
}

/// Waits for an agent process other than `old`, then for its /readyz: (its pid, its start to
/// ready).
pub fn wait_new_agent(c: &Cluster, old: u32, timeout: Duration) -> Result<(u32, Duration)> {
    let (pid, started) = poll_every(Duration::from_millis(20), timeout, || {
        let pid = agent_pid(c).ok().filter(|p| *p != old)?;
        Some((pid, process_start(pid)?))
    })
    .ok_or_else(|| anyhow!("no new agent process within {timeout:?}"))?;
    poll_every(Duration::from_millis(10), timeout, || {
        agent_ready().then_some(())
    })
    .ok_or_else(|| anyhow!("the new agent (pid {pid}) not ready within {timeout:?}"))?;
    let ready = SystemTime::now();
    Ok((pid, ready.duration_since(started).unwrap_or_default()))
}

/// A process's start on the wall clock (its start time in clock ticks after boot).
pub fn process_start(pid: u32) -> Option<SystemTime> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    let ticks: f64 = after.split_whitespace().nth(19)?.parse().ok()?;
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()??
        .max(1) as f64;
    let uptime: f64 = std::fs::read_to_string("/proc/uptime")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let ago = (uptime - ticks / hz).max(0.0);
    SystemTime::now().checked_sub(Duration::from_secs_f64(ago))
}

/// The agent's rollout (`kubectl rollout restart`), waited for until it answers /readyz.
pub fn roll_out_agent(c: &Cluster) -> Result<()> {
    crate::cluster::restart_agents(c, "a rollout")?;
    poll_every(POLL, Duration::from_secs(120), || {
        agent_ready().then_some(())
    })
    .ok_or_else(|| anyhow!("the rolled-out agent is not ready within 120 s"))
}

/// The API Priority and Fairness objects that give the agent's service account a small share
/// of the API server's concurrency, rejecting (429) what does not fit: the throttling a busy
/// API server applies, for real.
pub const THROTTLE_LEVEL: &str = "observer-throttled";

pub fn throttle_agent(c: &Cluster, on: bool) -> Result<()> {
    if !on {
        c.kubectl_ok(&["delete", "flowschema", THROTTLE_LEVEL, "--ignore-not-found"])?;
        c.kubectl_ok(&[
            "delete",
            "prioritylevelconfiguration",
            THROTTLE_LEVEL,
            "--ignore-not-found",
        ])?;
        return Ok(());
    }
    let level = serde_json::json!({
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
        "kind": "PriorityLevelConfiguration",
        "metadata": {"name": THROTTLE_LEVEL},
        "spec": {"type": "Limited", "limited": {
            "nominalConcurrencyShares": 1,
            "lendablePercent": 0,
            "borrowingLimitPercent": 0,
            "limitResponse": {"type": "Reject"},
        }},
    });
    let schema = serde_json::json!({
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
        "kind": "FlowSchema",
        "metadata": {"name": THROTTLE_LEVEL},
        "spec": {
            "priorityLevelConfiguration": {"name": THROTTLE_LEVEL},
            // Before the suggested schemas (service accounts match at 9000).
            "matchingPrecedence": 500,
            "distinguisherMethod": {"type": "ByUser"},
            "rules": [{
                "subjects": [{"kind": "ServiceAccount", "serviceAccount": {"name": "observer", "namespace": AGENT_NAMESPACE}}],
                "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"], "namespaces": ["*"], "clusterScope": true}],
            }],
        },
    });
    crate::cluster::apply(c, &level.to_string())?;
    crate::cluster::apply(c, &schema.to_string())
}

/// The API server's count of requests it rejected at the throttling level (from its /metrics).
pub fn throttled_by_server(c: &Cluster) -> Result<u64> {
    let text = c.kubectl_ok(&["get", "--raw", "/metrics"])?;
    Ok(text
        .lines()
        .filter(|l| {
            l.starts_with("apiserver_flowcontrol_rejected_requests_total{")
                && l.contains(THROTTLE_LEVEL)
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum::<f64>() as u64)
}

/// A memory hog outside the pods: bursts of most of the node's available memory (the
/// `observer-workload bursty` mode), first in line for the OOM killer. Killed on drop.
pub struct MemoryHog(std::process::Child);

impl MemoryHog {
    pub fn start(secs: u64) -> Result<Self> {
        let meminfo = std::fs::read_to_string("/proc/meminfo")?;
        let available_kib: u64 = meminfo
            .lines()
            .find(|l| l.starts_with("MemAvailable:"))
            .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            .ok_or_else(|| anyhow!("no MemAvailable in /proc/meminfo"))?;
        // All but 1 GiB of what is available: the node reclaims its caches at every burst.
        let mib = (available_kib / 1024).saturating_sub(1024).max(256);
        let child = std::process::Command::new(crate::kernel::workload())
            .args(["bursty", &mib.to_string(), &secs.to_string()])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .spawn()?;
        std::fs::write(format!("/proc/{}/oom_score_adj", child.id()), "1000")?;
        Ok(Self(child))
    }

    /// Waits for the hog's end (its SECS).
    pub fn wait(mut self) -> Result<()> {
        let st = self.0.wait()?;
        if !st.success() {
            bail!("the memory hog ended with {st} (the OOM killer took it?)");
        }
        Ok(())
    }
}

impl Drop for MemoryHog {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(received_ms: u64, took_ms: u64) -> Write {
        let received = SystemTime::UNIX_EPOCH + Duration::from_millis(received_ms);
        Write {
            received,
            completed: received + Duration::from_millis(took_ms),
            alive: Some("False".into()),
            signature: "same".into(),
        }
    }

    fn writes(ws: Vec<Write>) -> Account {
        let writes = BTreeMap::from([("p".to_string(), ws)]);
        account(
            &[],
            &HashSet::new(),
            &writes,
            &HashMap::new(),
            &HashMap::new(),
            0,
            &[],
        )
    }

    #[test]
    fn a_write_sent_again_after_its_answer_is_a_duplicate() {
        let a = writes(vec![write(0, 30), write(1_000, 30)]);
        assert_eq!((a.duplicate_writes, a.resent_unanswered), (1, 0));
    }

    #[test]
    fn a_write_sent_again_without_an_answer_is_a_retry() {
        // The first outlived the agent's timeout at the server.
        let a = writes(vec![write(0, 6_000), write(6_500, 30)]);
        assert_eq!((a.duplicate_writes, a.resent_unanswered), (0, 1));
        // The second reached the server while the first was still running there.
        let a = writes(vec![write(0, 3_000), write(2_500, 30)]);
        assert_eq!((a.duplicate_writes, a.resent_unanswered), (0, 1));
        // Different writes are neither.
        let mut other = write(1_000, 30);
        other.signature = "other".into();
        let a = writes(vec![write(0, 6_000), other]);
        assert_eq!((a.duplicate_writes, a.resent_unanswered), (0, 0));
    }
}
