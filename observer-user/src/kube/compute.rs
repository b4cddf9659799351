//! kubelet's PodStatus, computed from the reconciled view: a pure function of the pod (spec,
//! metadata and the status in the API), the reconciled containers with the kernel's evidence,
//! the previous status and the time.
//!
//! The rules are kubelet's (`generateAPIPodStatus`, `convertToAPIContainerStatuses`, `getPhase`,
//! `status.Generate*Condition`, `mergePodStatus`), with the kernel's account where kubelet has
//! the runtime's:
//! - `OOMKilled` only when the container's own init was killed (or its whole group, which takes
//!   the init with a SIGKILL): a child killed under an init that went on and exited by itself is
//!   the init's own exit (`Completed` / `Error`), with the kill kept as evidence.
//! - a death is reported from the kernel's exit record, before the runtime is asked.
//!
//! What the agent cannot know is listed in [`ComputedStatus::unknown`], never guessed: probe
//! results (readiness, startup) live in kubelet; the view has no pod IPs or image digests; with
//! no pod spec, the restart policy, init containers and readiness gates are unknown.
use std::{fmt, time::SystemTime};

use k8s_openapi::{
    api::core::v1::{
        Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
        ContainerStateWaiting, ContainerStatus, Pod, PodCondition, PodSpec, PodStatus,
    },
    apimachinery::pkg::apis::meta::v1::Time,
    jiff::Timestamp,
};

use super::conditions::{is_sidecar, keep_transition, observer_conditions, ConditionTypes};
use crate::reconcile::{ContainerPhase, ContainerView, PodView};

/// kubelet's condition types: the agent writes none of them except in `full` mode.
pub const KUBELET_CONDITIONS: &[&str] = &[
    "PodScheduled",
    "Ready",
    "Initialized",
    "ContainersReady",
    "PodReadyToStartContainers",
    "PodResizePending",
    "PodResizeInProgress",
];
/// Shared with the eviction and disruption controllers.
pub const DISRUPTION_TARGET: &str = "DisruptionTarget";

pub fn kubelet_owns(condition_type: &str) -> bool {
    KUBELET_CONDITIONS.contains(&condition_type)
}

/// kubelet's waiting reasons.
pub const CONTAINER_CREATING: &str = "ContainerCreating";
pub const POD_INITIALIZING: &str = "PodInitializing";
pub const CRASH_LOOP_BACK_OFF: &str = "CrashLoopBackOff";
pub const STATUS_UNKNOWN: &str = "ContainerStatusUnknown";

/// kubelet's restart back-off: 10 s doubling to 300 s.
pub const BACKOFF_INITIAL_SECS: u64 = 10;
pub const BACKOFF_MAX_SECS: u64 = 300;
/// A container that ran this long before dying starts its back-off over (kubelet's back-off
/// entries expire after twice the maximum).
pub const BACKOFF_RESET_SECS: u64 = 600;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestartPolicy {
    Always,
    OnFailure,
    Never,
}

impl RestartPolicy {
    /// The API defaults `restartPolicy` to Always.
    pub fn of(spec: &PodSpec) -> Self {
        match spec.restart_policy.as_deref() {
            Some("OnFailure") => RestartPolicy::OnFailure,
            Some("Never") => RestartPolicy::Never,
            _ => RestartPolicy::Always,
        }
    }
}

/// Everything the computation reads.
#[derive(Clone, Copy)]
pub struct StatusInputs<'a> {
    /// The pod from the API: spec, metadata (deletion), and kubelet's status. `None` when the
    /// API is not reachable (`observer status` without a cluster).
    pub pod: Option<&'a Pod>,
    pub view: &'a PodView,
    /// The status this agent computed last (kubelet's status cache); the API's when `None`.
    pub previous: Option<&'a PodStatus>,
    pub now: SystemTime,
    /// Scheme of container ids: `containerd` gives `containerd://<id>`.
    pub runtime: &'a str,
    pub types: &'a ConditionTypes,
}

/// What the agent cannot know, said instead of guessed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unknown {
    /// No pod spec: restart policy, init containers, sidecars, probes and readiness gates are
    /// unknown. Containers are the ones the runtime has; Ready, ContainersReady and Initialized
    /// are left out.
    PodSpec,
    /// Every container stopped and the restart policy is unknown: Running, Succeeded or Failed.
    Phase,
    /// The container has a readiness probe (or no spec says it has none): its result lives in
    /// kubelet. `ready` is kubelet's last word for this instance, else false.
    Readiness(String),
    /// Same for a startup probe and `started`.
    Startup(String),
    /// The view has no sandbox network status: pod and host IPs are the API's.
    PodIps,
    /// The view has no image digest: `imageID` is the API's for this container id, else empty.
    ImageId(String),
}

impl fmt::Display for Unknown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unknown::PodSpec => f.write_str(
                "no pod spec: restart policy, init containers, probes and readiness gates unknown",
            ),
            Unknown::Phase => {
                f.write_str("phase: every container stopped; the restart policy decides")
            }
            Unknown::Readiness(c) => write!(f, "{c}: readiness probe result (kubelet's)"),
            Unknown::Startup(c) => write!(f, "{c}: startup probe result (kubelet's)"),
            Unknown::PodIps => f.write_str("pod IPs: kept from the API"),
            Unknown::ImageId(c) => write!(f, "{c}: image digest not in the view"),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ComputedStatus {
    pub status: PodStatus,
    pub unknown: Vec<Unknown>,
}

pub fn to_time(t: SystemTime) -> Time {
    Time(Timestamp::try_from(t).unwrap_or(Timestamp::UNIX_EPOCH))
}

pub fn rfc3339(t: SystemTime) -> String {
    let ts = Timestamp::try_from(t).unwrap_or(Timestamp::UNIX_EPOCH);
    Timestamp::from_second(ts.as_second())
        .unwrap_or(ts)
        .to_string()
}

/// The status kubelet would write for this pod, with the kernel's account and the observer's
/// conditions.
pub fn compute_status(inp: &StatusInputs<'_>) -> ComputedStatus {
    let api = inp.pod.and_then(|p| p.status.as_ref());
    let empty = PodStatus::default();
    let old = inp.previous.or(api).unwrap_or(&empty);
    let mut unknown = Vec::new();
    let spec = inp.pod.and_then(|p| p.spec.as_ref());
    let mut status = match spec {
        Some(spec) => with_spec(inp, spec, old, &mut unknown),
        None => without_spec(inp, old, &mut unknown),
    };

    // Not the view's to say: kept from the API (kubelet or the API server wrote them).
    if let Some(api) = api {
        status.pod_ip = api.pod_ip.clone();
        status.pod_ips = api.pod_ips.clone();
        status.host_ip = api.host_ip.clone();
        status.host_ips = api.host_ips.clone();
        status.qos_class = api.qos_class.clone();
        status.nominated_node_name = api.nominated_node_name.clone();
        status.resource_claim_statuses = api.resource_claim_statuses.clone();
    }
    unknown.push(Unknown::PodIps);

    // kubelet keeps the start time across updates.
    status.start_time = old
        .start_time
        .clone()
        .or_else(|| inp.view.created_at.map(to_time))
        .or_else(|| Some(to_time(inp.now)));

    // Terminal phases never go back (kubelet's generateAPIPodStatus, in this order).
    let terminal = |p: Option<&str>| matches!(p, Some("Succeeded" | "Failed"));
    if !terminal(status.phase.as_deref()) {
        if terminal(old.phase.as_deref()) {
            status.phase = old.phase.clone();
        } else if terminal(api.and_then(|a| a.phase.as_deref())) {
            status.phase = api.and_then(|a| a.phase.clone());
        }
    }
    if status.phase.is_some() && status.phase == old.phase {
        status.reason = old.reason.clone();
        status.message = old.message.clone();
    }
    // A terminal pod is never Ready (kubelet's mergePodStatus, issue 108594).
    if terminal(status.phase.as_deref()) {
        let reason = if status.phase.as_deref() == Some("Succeeded") {
            "PodCompleted"
        } else {
            "PodFailed"
        };
        for c in status.conditions.iter_mut().flatten() {
            if (c.type_ == "Ready" || c.type_ == "ContainersReady") && c.status == "True" {
                c.status = "False".into();
                c.reason = Some(reason.into());
                c.message = None;
                c.last_transition_time = Some(to_time(inp.now));
            }
        }
    }
    ComputedStatus { status, unknown }
}

struct Ctx<'a> {
    inp: &'a StatusInputs<'a>,
    policy: Option<RestartPolicy>,
    deleting: bool,
    /// `name_namespace(uid)`, kubelet's `format.Pod`, for back-off messages.
    pod_label: String,
}

fn with_spec(
    inp: &StatusInputs<'_>,
    spec: &PodSpec,
    old: &PodStatus,
    unknown: &mut Vec<Unknown>,
) -> PodStatus {
    let view = inp.view;
    let ctx = Ctx {
        inp,
        policy: Some(RestartPolicy::of(spec)),
        deleting: inp
            .pod
            .is_some_and(|p| p.metadata.deletion_timestamp.is_some()),
        pod_label: format!("{}_{}({})", view.name, view.namespace, view.uid),
    };
    let init_specs: &[Container] = spec.init_containers.as_deref().unwrap_or(&[]);
    let has_init = !init_specs.is_empty();
    let any_regular_created = spec
        .containers
        .iter()
        .any(|c| view.containers.iter().any(|v| v.name == c.name));
    let mut regular = statuses(
        &ctx,
        &spec.containers,
        old.container_statuses.as_deref().unwrap_or(&[]),
        has_init,
        false,
        any_regular_created,
        unknown,
    );
    // kubelet sorts regular statuses by name, init statuses in spec order.
    regular.sort_by(|a, b| a.name.cmp(&b.name));
    let init = statuses(
        &ctx,
        init_specs,
        old.init_container_statuses.as_deref().unwrap_or(&[]),
        has_init,
        true,
        any_regular_created,
        unknown,
    );

    let has_initialized = spec.containers.iter().any(|c| {
        view.current()
            .any(|v| v.name == c.name && v.phase == ContainerPhase::Running)
    });
    let phase = get_phase(spec, &init, &regular, ctx.deleting, has_initialized);

    // Conditions: everything not kubelet's as the API has it (kubelet's mergePodStatus), the
    // observer's own replaced by the computed ones, then kubelet's in its order.
    let api_conditions: &[PodCondition] = inp
        .pod
        .and_then(|p| p.status.as_ref())
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or(&[]);
    let old_conditions = old.conditions.as_deref().unwrap_or(&[]);
    let ours = observer_conditions(Some(spec), view, old_conditions, inp.types, inp.now);
    let mut conditions: Vec<PodCondition> = api_conditions
        .iter()
        .filter(|c| !kubelet_owns(&c.type_) && c.type_ != DISRUPTION_TARGET)
        .filter(|c| !ours.iter().any(|o| o.type_ == c.type_))
        .cloned()
        .collect();
    conditions.extend(ours);
    if let Some(d) = old_conditions.iter().find(|c| c.type_ == DISRUPTION_TARGET) {
        conditions.push(d.clone());
    }
    let all: Vec<&ContainerStatus> = init.iter().chain(regular.iter()).collect();
    let mut kubelet = vec![
        condition("PodReadyToStartContainers", view.sandbox_ready, None, None),
        initialized_condition(spec, &all, &phase),
    ];
    let containers_ready = containers_ready_condition(spec, &all, &phase);
    kubelet.push(ready_condition(spec, &conditions, &containers_ready));
    kubelet.push(containers_ready);
    kubelet.push(condition("PodScheduled", true, None, None));
    for c in kubelet {
        conditions.push(keep_transition(c, old_conditions, inp.now));
    }

    PodStatus {
        phase: Some(phase),
        conditions: Some(conditions),
        container_statuses: Some(regular),
        init_container_statuses: has_init.then_some(init),
        ..Default::default()
    }
}

fn without_spec(inp: &StatusInputs<'_>, old: &PodStatus, unknown: &mut Vec<Unknown>) -> PodStatus {
    unknown.push(Unknown::PodSpec);
    let view = inp.view;
    let ctx = Ctx {
        inp,
        policy: None,
        deleting: false,
        pod_label: format!("{}_{}({})", view.name, view.namespace, view.uid),
    };
    let mut names: Vec<&str> = Vec::new();
    for c in &view.containers {
        if !names.contains(&c.name.as_str()) {
            names.push(&c.name);
        }
    }
    let old_statuses: Vec<ContainerStatus> = old
        .container_statuses
        .iter()
        .chain(old.init_container_statuses.iter())
        .flatten()
        .cloned()
        .collect();
    let mut statuses: Vec<ContainerStatus> = names
        .iter()
        .map(|name| {
            let old = old_statuses.iter().find(|s| s.name == *name);
            let mut s = container_status(&ctx, name, None, old, false, false);
            // Probes are unknown without the spec: started unknown, ready not claimed.
            s.started = None;
            s.ready = false;
            if s.state.as_ref().is_some_and(|st| st.running.is_some()) {
                unknown.push(Unknown::Readiness(name.to_string()));
            }
            s
        })
        .collect();
    statuses.sort_by(|a, b| a.name.cmp(&b.name));
    let (mut running, mut waiting, mut stopped) = (0, 0, 0);
    for s in &statuses {
        match s.state.as_ref() {
            Some(st) if st.running.is_some() => running += 1,
            Some(st) if st.terminated.is_some() => stopped += 1,
            _ => waiting += 1,
        }
    }
    let phase = if waiting > 0 || statuses.is_empty() {
        Some("Pending".to_string())
    } else if running > 0 {
        Some("Running".to_string())
    } else {
        let _ = stopped;
        unknown.push(Unknown::Phase);
        None
    };
    let old_conditions = old.conditions.as_deref().unwrap_or(&[]);
    let mut conditions = observer_conditions(None, view, old_conditions, inp.types, inp.now);
    for c in [
        condition("PodReadyToStartContainers", view.sandbox_ready, None, None),
        condition("PodScheduled", true, None, None),
    ] {
        conditions.push(keep_transition(c, old_conditions, inp.now));
    }
    PodStatus {
        phase,
        conditions: Some(conditions),
        container_statuses: Some(statuses),
        ..Default::default()
    }
}

fn condition(type_: &str, ok: bool, reason: Option<&str>, message: Option<String>) -> PodCondition {
    PodCondition {
        type_: type_.to_string(),
        status: if ok { "True" } else { "False" }.to_string(),
        reason: reason.map(str::to_string),
        message,
        ..Default::default()
    }
}

/// The instances of a container, newest first (the view keeps the newest attempt last).
fn instances<'v>(view: &'v PodView, name: &str) -> Vec<&'v ContainerView> {
    let mut v: Vec<&ContainerView> = view.containers.iter().filter(|c| c.name == name).collect();
    v.sort_by_key(|c| std::cmp::Reverse((c.restart_count, c.created_at)));
    v
}

/// kubelet's `convertToAPIContainerStatuses` for one list (regular or init containers).
fn statuses(
    ctx: &Ctx<'_>,
    specs: &[Container],
    old: &[ContainerStatus],
    has_init: bool,
    is_init: bool,
    any_regular_created: bool,
    unknown: &mut Vec<Unknown>,
) -> Vec<ContainerStatus> {
    specs
        .iter()
        .map(|c| {
            let old = old.iter().find(|s| s.name == c.name);
            let mut s = container_status(ctx, &c.name, Some(c), old, has_init, is_init);
            let sidecar = is_init && is_sidecar(c);
            // kubelet: an init container the runtime forgot, once regular containers exist, ran
            // to completion.
            if is_init
                && !sidecar
                && any_regular_created
                && instances(ctx.inp.view, &c.name).is_empty()
                && s.state.as_ref().is_some_and(|st| st.waiting.is_some())
            {
                s.state = Some(ContainerState {
                    terminated: Some(ContainerStateTerminated {
                        reason: Some("Completed".into()),
                        message: Some(
                            "Unable to get init container status from container runtime and pod \
                             has been initialized, treat it as exited normally"
                                .into(),
                        ),
                        exit_code: 0,
                        ..Default::default()
                    }),
                    ..Default::default()
                });
            }
            probes(c, &mut s, old, is_init && !sidecar, unknown);
            if let Some(cur) = instances(ctx.inp.view, &c.name).first() {
                if s.image_id.is_empty() {
                    unknown.push(Unknown::ImageId(cur.name.clone()));
                }
            }
            s
        })
        .collect()
}

fn container_id(ctx: &Ctx<'_>, v: &ContainerView) -> String {
    format!("{}://{}", ctx.inp.runtime, v.id)
}

/// One container's status: default waiting, the old status's history, the newest instance's
/// state, the previous instance as lastState, then CrashLoopBackOff where kubelet waits.
fn container_status(
    ctx: &Ctx<'_>,
    name: &str,
    spec: Option<&Container>,
    old: Option<&ContainerStatus>,
    has_init: bool,
    is_init: bool,
) -> ContainerStatus {
    let default_reason = if has_init {
        POD_INITIALIZING
    } else {
        CONTAINER_CREATING
    };
    let mut s = ContainerStatus {
        name: name.to_string(),
        image: spec.and_then(|c| c.image.clone()).unwrap_or_default(),
        state: Some(waiting(Some(default_reason), None)),
        ..Default::default()
    };
    if let Some(o) = old {
        if o.state.as_ref().is_some_and(|st| st.terminated.is_some()) {
            s = o.clone();
        } else {
            s.restart_count = o.restart_count;
            s.last_state = o.last_state.clone();
        }
    }
    let inst = instances(ctx.inp.view, name);
    match inst.first() {
        None => {
            // The runtime lost a container kubelet had seen running: it terminated, how is
            // unknown (kubelet's ContainerStatusUnknown / 137), and it has been restarted.
            let was_running =
                old.is_some_and(|o| o.state.as_ref().is_some_and(|st| st.running.is_some()));
            let default = s
                .state
                .as_ref()
                .and_then(|st| st.waiting.as_ref())
                .is_some_and(|w| w.reason.as_deref() == Some(default_reason));
            let no_last = s.last_state.as_ref().is_none_or(|l| l.terminated.is_none());
            if was_running && default && no_last {
                s.last_state = Some(ContainerState {
                    terminated: Some(ContainerStateTerminated {
                        reason: Some(STATUS_UNKNOWN.into()),
                        message: Some(
                            "The container could not be located when the pod was deleted.  The \
                             container used to be Running"
                                .into(),
                        ),
                        exit_code: 137,
                        ..Default::default()
                    }),
                    ..Default::default()
                });
                if !ctx.deleting {
                    s.restart_count += 1;
                }
            }
            return s;
        }
        Some(cur) => {
            let id = container_id(ctx, cur);
            let same_as_old = old.filter(|o| o.container_id.as_deref() == Some(id.as_str()));
            s.container_id = Some(id);
            s.restart_count = cur.restart_count as i32;
            if !cur.image.is_empty() {
                s.image = cur.image.clone();
            }
            s.image_id = same_as_old.map(|o| o.image_id.clone()).unwrap_or_default();
            s.state = Some(state_of(ctx, cur, old, &mut s.restart_count));
            s.last_state = match inst.get(1) {
                Some(prev) => Some(state_of(ctx, prev, None, &mut 0)),
                None if s.last_state.is_some() && same_as_old.is_none() => s.last_state.clone(),
                None => None,
            };
        }
    }
    let cur = inst[0];
    if should_restart(ctx, spec, cur, is_init) {
        if let Some(delay) = backoff(cur) {
            let until = cur.finished_at.map(|f| f + delay);
            if until.is_some_and(|u| ctx.inp.now < u) {
                s.last_state = s.state.take();
                s.state = Some(waiting(
                    Some(CRASH_LOOP_BACK_OFF),
                    Some(format!(
                        "back-off {}s restarting failed container={} pod={}",
                        delay.as_secs(),
                        name,
                        ctx.pod_label
                    )),
                ));
            }
        }
    }
    s
}

fn waiting(reason: Option<&str>, message: Option<String>) -> ContainerState {
    ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: reason.map(str::to_string),
            message,
        }),
        ..Default::default()
    }
}

/// The state of one instance (kubelet's `convertContainerStatus`).
fn state_of(
    ctx: &Ctx<'_>,
    v: &ContainerView,
    old: Option<&ContainerStatus>,
    restart_count: &mut i32,
) -> ContainerState {
    match v.phase {
        ContainerPhase::Running => ContainerState {
            running: Some(ContainerStateRunning {
                started_at: v.started_at.map(to_time),
            }),
            ..Default::default()
        },
        // Created, not started: "waiting to be running", with no reason.
        ContainerPhase::Created => waiting(None, None),
        ContainerPhase::Exited => ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: v.exit_code.unwrap_or(137),
                signal: v.signal.map(i32::from),
                reason: Some(terminated_reason(v)),
                started_at: v.started_at.map(to_time),
                finished_at: v.finished_at.map(to_time),
                container_id: Some(container_id(ctx, v)),
                message: None,
            }),
            ..Default::default()
        },
        ContainerPhase::Unknown => {
            let was_running =
                old.is_some_and(|o| o.state.as_ref().is_some_and(|st| st.running.is_some()));
            if was_running {
                *restart_count = old.map_or(0, |o| o.restart_count) + 1;
                ContainerState {
                    terminated: Some(ContainerStateTerminated {
                        reason: Some(STATUS_UNKNOWN.into()),
                        message: Some(
                            "The container could not be located when the pod was terminated".into(),
                        ),
                        exit_code: 137,
                        ..Default::default()
                    }),
                    ..Default::default()
                }
            } else {
                waiting(None, None)
            }
        }
    }
}

/// The reason of an exited instance, with the kernel's evidence: `OOMKilled` only when the
/// container's init was the victim (or died of SIGKILL while the OOM killer worked in its
/// container: a group kill); a child killed under an init that exited by itself is the init's
/// own exit.
pub fn terminated_reason(v: &ContainerView) -> String {
    let code = v.exit_code.unwrap_or(137);
    let own = if code == 0 { "Completed" } else { "Error" };
    let sigkill = v.signal == Some(9) || (v.signal.is_none() && code == 137);
    match (&v.last_oom, v.reason.as_deref()) {
        (Some(o), _) if o.init == Some(true) => "OOMKilled".into(),
        (Some(_), Some("OOMKilled")) if !sigkill => own.into(),
        (_, Some(r)) => r.into(),
        (_, None) => own.into(),
    }
}

fn should_restart(
    ctx: &Ctx<'_>,
    spec: Option<&Container>,
    v: &ContainerView,
    is_init: bool,
) -> bool {
    if ctx.deleting || !matches!(v.phase, ContainerPhase::Exited | ContainerPhase::Unknown) {
        return false;
    }
    let Some(policy) = ctx.policy else {
        return false;
    };
    if spec.is_some_and(|c| is_init && is_sidecar(c)) {
        return true;
    }
    let code = v.exit_code.unwrap_or(137);
    if is_init && code == 0 {
        return false;
    }
    match policy {
        RestartPolicy::Always => true,
        RestartPolicy::OnFailure => code != 0,
        // A failed regular init container under Never fails the pod.
        RestartPolicy::Never => false,
    }
}

/// kubelet's back-off before restarting this dead instance, if any: the first death restarts at
/// once; then 10 s doubling to 300 s; a container that ran 10 minutes starts over.
pub fn backoff(v: &ContainerView) -> Option<std::time::Duration> {
    let ran = match (v.started_at, v.finished_at) {
        (Some(s), Some(f)) => f.duration_since(s).unwrap_or_default(),
        _ => std::time::Duration::ZERO,
    };
    if v.restart_count == 0 || ran.as_secs() >= BACKOFF_RESET_SECS {
        return None;
    }
    let shift = (v.restart_count - 1).min(16);
    let secs = (BACKOFF_INITIAL_SECS << shift).min(BACKOFF_MAX_SECS);
    Some(std::time::Duration::from_secs(secs))
}

/// kubelet's prober: `started` and `ready`, with what the agent cannot know said.
fn probes(
    c: &Container,
    s: &mut ContainerStatus,
    old: Option<&ContainerStatus>,
    regular_init: bool,
    unknown: &mut Vec<Unknown>,
) {
    let state = s.state.clone().unwrap_or_default();
    let running = state.running.is_some();
    let same = old.filter(|o| o.container_id == s.container_id && s.container_id.is_some());
    if regular_init {
        s.started = Some(running);
        s.ready = state.terminated.as_ref().is_some_and(|t| t.exit_code == 0);
        return;
    }
    let started = if !running {
        false
    } else if c.startup_probe.is_some() {
        unknown.push(Unknown::Startup(c.name.clone()));
        same.and_then(|o| o.started).unwrap_or(false)
    } else {
        true
    };
    s.started = Some(started);
    s.ready = if !running || !started {
        false
    } else if c.readiness_probe.is_some() {
        unknown.push(Unknown::Readiness(c.name.clone()));
        same.is_some_and(|o| o.ready)
    } else {
        true
    };
}

fn state_kind(s: &ContainerStatus) -> (bool, bool, bool) {
    let st = s.state.clone().unwrap_or_default();
    (
        st.running.is_some(),
        st.terminated.is_some(),
        st.waiting.is_some(),
    )
}

fn last_terminated(s: &ContainerStatus) -> Option<&ContainerStateTerminated> {
    s.last_state.as_ref().and_then(|l| l.terminated.as_ref())
}

/// kubelet's `getPhase` (without the alpha ContainerRestartRules gate).
fn get_phase(
    spec: &PodSpec,
    init: &[ContainerStatus],
    regular: &[ContainerStatus],
    pod_is_terminal: bool,
    has_initialized: bool,
) -> String {
    let policy = RestartPolicy::of(spec);
    let init_specs: &[Container] = spec.init_containers.as_deref().unwrap_or(&[]);
    let find = |list: &'_ [ContainerStatus], name: &str| -> Option<ContainerStatus> {
        list.iter().find(|s| s.name == name).cloned()
    };
    let (mut pending_sidecars, mut pending_init, mut failed_init) = (0, 0, 0);
    for c in init_specs.iter().filter(|c| !is_sidecar(c)) {
        let Some(s) = find(init, &c.name) else {
            pending_init += 1;
            continue;
        };
        match state_kind(&s) {
            (true, _, _) => pending_init += 1,
            (_, true, _) => {
                let st = s.state.as_ref().and_then(|st| st.terminated.as_ref());
                if st.is_some_and(|t| t.exit_code != 0) {
                    failed_init += 1;
                }
            }
            (_, _, true) => match last_terminated(&s) {
                Some(t) if t.exit_code != 0 => failed_init += 1,
                Some(_) => {}
                None => pending_init += 1,
            },
            _ => pending_init += 1,
        }
    }
    let (mut unknown, mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0, 0);
    for c in init_specs.iter().filter(|c| is_sidecar(c)) {
        let Some(s) = find(init, &c.name) else {
            unknown += 1;
            continue;
        };
        match state_kind(&s) {
            (true, _, _) => {
                if s.started != Some(true) {
                    pending_sidecars += 1;
                }
                running += 1;
            }
            (_, true, _) => {}
            (_, _, true) => {
                if last_terminated(&s).is_none() {
                    pending_sidecars += 1;
                    waiting += 1;
                }
            }
            _ => {
                pending_sidecars += 1;
                unknown += 1;
            }
        }
    }
    for c in &spec.containers {
        let Some(s) = find(regular, &c.name) else {
            unknown += 1;
            continue;
        };
        match state_kind(&s) {
            (true, _, _) => running += 1,
            (_, true, _) => {
                stopped += 1;
                let st = s.state.as_ref().and_then(|st| st.terminated.as_ref());
                if st.is_some_and(|t| t.exit_code == 0) {
                    succeeded += 1;
                }
            }
            (_, _, true) => {
                if last_terminated(&s).is_some() {
                    stopped += 1;
                } else {
                    waiting += 1;
                }
            }
            _ => unknown += 1,
        }
    }
    if failed_init > 0 && policy == RestartPolicy::Never {
        return "Failed".into();
    }
    let phase = if pending_init > 0 || (pending_sidecars > 0 && !has_initialized) || waiting > 0 {
        "Pending"
    } else if running > 0 && unknown == 0 {
        "Running"
    } else if running == 0 && stopped > 0 && unknown == 0 {
        if pod_is_terminal {
            if stopped == succeeded {
                "Succeeded"
            } else {
                "Failed"
            }
        } else if policy == RestartPolicy::Always {
            "Running"
        } else if stopped == succeeded {
            "Succeeded"
        } else if policy == RestartPolicy::Never {
            "Failed"
        } else {
            "Running"
        }
    } else {
        "Pending"
    };
    phase.into()
}

fn terminal_phase(phase: &str) -> bool {
    phase == "Succeeded" || phase == "Failed"
}

fn containers_ready_condition(
    spec: &PodSpec,
    all: &[&ContainerStatus],
    phase: &str,
) -> PodCondition {
    let find = |name: &str| all.iter().find(|s| s.name == name);
    let mut unknown = Vec::new();
    let mut unready = Vec::new();
    let sidecars = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| is_sidecar(c));
    for c in sidecars.chain(spec.containers.iter()) {
        match find(&c.name) {
            Some(s) if !s.ready => unready.push(c.name.clone()),
            Some(_) => {}
            None => unknown.push(c.name.clone()),
        }
    }
    if terminal_phase(phase) && (phase == "Failed" || unknown.is_empty()) {
        let reason = if phase == "Failed" {
            "PodFailed"
        } else {
            "PodCompleted"
        };
        return condition("ContainersReady", false, Some(reason), None);
    }
    let mut msgs = Vec::new();
    if !unknown.is_empty() {
        msgs.push(format!(
            "containers with unknown status: [{}]",
            unknown.join(" ")
        ));
    }
    if !unready.is_empty() {
        msgs.push(format!(
            "containers with unready status: [{}]",
            unready.join(" ")
        ));
    }
    if msgs.is_empty() {
        condition("ContainersReady", true, None, None)
    } else {
        condition(
            "ContainersReady",
            false,
            Some("ContainersNotReady"),
            Some(msgs.join(", ")),
        )
    }
}

/// kubelet's Ready: ContainersReady, then every readiness gate's condition True.
fn ready_condition(
    spec: &PodSpec,
    conditions: &[PodCondition],
    containers_ready: &PodCondition,
) -> PodCondition {
    if containers_ready.status != "True" {
        return PodCondition {
            type_: "Ready".into(),
            ..containers_ready.clone()
        };
    }
    let mut msgs = Vec::new();
    for gate in spec.readiness_gates.iter().flatten() {
        match conditions.iter().find(|c| c.type_ == gate.condition_type) {
            None => msgs.push(format!(
                "corresponding condition of pod readiness gate \"{}\" does not exist.",
                gate.condition_type
            )),
            Some(c) if c.status != "True" => msgs.push(format!(
                "the status of pod readiness gate \"{}\" is not \"True\", but {}",
                gate.condition_type, c.status
            )),
            Some(_) => {}
        }
    }
    if msgs.is_empty() {
        condition("Ready", true, None, None)
    } else {
        condition(
            "Ready",
            false,
            Some("ReadinessGatesNotReady"),
            Some(msgs.join(", ")),
        )
    }
}

fn initialized_condition(spec: &PodSpec, all: &[&ContainerStatus], phase: &str) -> PodCondition {
    let init_specs: &[Container] = spec.init_containers.as_deref().unwrap_or(&[]);
    let find = |name: &str| all.iter().find(|s| s.name == name);
    let mut unknown = Vec::new();
    let mut incomplete = Vec::new();
    for c in init_specs {
        match find(&c.name) {
            None => unknown.push(c.name.clone()),
            Some(s) => {
                let ok = if is_sidecar(c) {
                    s.started == Some(true)
                } else {
                    s.ready
                };
                if !ok {
                    incomplete.push(c.name.clone());
                }
            }
        }
    }
    if phase == "Succeeded" && unknown.is_empty() {
        return condition("Initialized", true, Some("PodCompleted"), None);
    }
    let regular_started = spec.containers.iter().any(|c| {
        find(&c.name).is_some_and(|s| {
            let (r, t, _) = state_kind(s);
            r || t || last_terminated(s).is_some()
        })
    });
    if regular_started {
        return condition("Initialized", true, None, None);
    }
    let mut msgs = Vec::new();
    if !unknown.is_empty() {
        msgs.push(format!(
            "containers with unknown status: [{}]",
            unknown.join(" ")
        ));
    }
    if !incomplete.is_empty() {
        msgs.push(format!(
            "containers with incomplete status: [{}]",
            incomplete.join(" ")
        ));
    }
    if msgs.is_empty() {
        condition("Initialized", true, None, None)
    } else {
        condition(
            "Initialized",
            false,
            Some("ContainersNotInitialized"),
            Some(msgs.join(", ")),
        )
    }
}

#[cfg(test)]
mod tests;
