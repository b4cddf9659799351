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
//! `compute/kubelet.rs` holds kubelet's functions one for one; the inputs kubelet takes from its
//! own state are the agent's here: the prober (no probe: started and ready while running), the
//! reason cache (`CrashLoopBackOff` from kubelet's back-off and the kernel's exit times) and the
//! pod worker's `podIsTerminal` (a deleted pod whose sandbox stopped with nothing running).
//!
//! What the agent cannot know is listed in [`ComputedStatus::unknown`], never guessed: probe
//! results (readiness, startup) live in kubelet; the view has no pod IPs, image digests or
//! sandbox network status; with no pod spec, the restart policy, init containers and readiness
//! gates are unknown. Fields the agent does not compute (resources, ephemeral container
//! statuses, resize, resource claims, volume health) are the API's; `status.observedGeneration`
//! and each kubelet condition's are the pod's generation, as a 1.35+ kubelet writes them.
use std::{fmt, time::SystemTime};

use k8s_openapi::{
    api::core::v1::{Container, ContainerStatus, Pod, PodCondition, PodSpec, PodStatus},
    apimachinery::pkg::apis::meta::v1::Time,
    jiff::Timestamp,
};

use super::conditions::{is_sidecar, keep_transition, observer_conditions, ConditionTypes};
use crate::reconcile::{ContainerPhase, ContainerView, PodView};
pub(crate) use kubelet::{
    all_containers_could_restart, container_should_restart, should_all_containers_restart,
};
use kubelet::{
    all_containers_restarting_condition, condition, containers_ready_condition, get_phase,
    initialized_condition, observed_generation, pod_ready_condition,
    ready_to_start_containers_condition, terminal_ready_condition, Convert, ReasonCache, Sandbox,
};

/// kubelet's condition types (1.37's `PodConditionByKubelet`, with PodReadyToStartContainers
/// and, from 1.36, AllContainersRestarting): the agent writes none of them except in `full`
/// mode, where the API's copies are replaced by what it computes, but for
/// [`KEPT_KUBELET_CONDITIONS`].
pub(crate) const KUBELET_CONDITIONS: &[&str] = &[
    "PodScheduled",
    "Ready",
    "Initialized",
    "ContainersReady",
    "PodResizeInProgress",
    "PodResizePending",
    "PodReadyToStartContainers",
    "AllContainersRestarting",
];
/// Shared with the eviction and disruption controllers.
pub(crate) const DISRUPTION_TARGET: &str = "DisruptionTarget";

pub(crate) fn kubelet_owns(condition_type: &str) -> bool {
    KUBELET_CONDITIONS.contains(&condition_type)
}

/// kubelet's waiting reasons.
pub(crate) const CONTAINER_CREATING: &str = "ContainerCreating";
pub(crate) const POD_INITIALIZING: &str = "PodInitializing";
pub(crate) const CRASH_LOOP_BACK_OFF: &str = "CrashLoopBackOff";
pub(crate) const STATUS_UNKNOWN: &str = "ContainerStatusUnknown";

/// kubelet's restart back-off (kubelet.go's `initialCrashLoopBackOff`, `MaxContainerBackOff`):
/// 10 s doubling to 300 s.
pub(crate) const BACKOFF_INITIAL_SECS: u64 = 10;
pub(crate) const BACKOFF_MAX_SECS: u64 = 300;
/// A back-off entry older than this when the container ends starts over (kubelet's
/// `HasExpiredFunc`: the end more than 600 s after the restart that started the instance).
pub(crate) const BACKOFF_RESET_SECS: u64 = 600;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RestartPolicy {
    Always,
    OnFailure,
    Never,
}

impl RestartPolicy {
    /// The API defaults `restartPolicy` to Always.
    pub(crate) fn of(spec: &PodSpec) -> Self {
        match spec.restart_policy.as_deref() {
            Some("OnFailure") => RestartPolicy::OnFailure,
            Some("Never") => RestartPolicy::Never,
            _ => RestartPolicy::Always,
        }
    }
}

/// Everything the computation reads.
#[derive(Clone, Copy)]
pub(crate) struct StatusInputs<'a> {
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
    /// The view lists the newest sandbox without its network status: its IP and namespace mode
    /// are not checked (PodReadyToStartContainers says True for a ready sandbox).
    SandboxNetwork,
    /// The pod is being deleted: kubelet's pod worker says when it is terminated; the agent
    /// takes a stopped sandbox with nothing running as the sign.
    Termination,
    /// The container waits for a reason only kubelet knows (its image pulls, its checks of the
    /// container's configuration, a failed create or start: [`KUBELET_REASONS`]): the reason and
    /// its message are kubelet's, kept from the API.
    KubeletReason(String),
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
            Unknown::SandboxNetwork => {
                f.write_str("sandbox network (IP, namespace mode): not in the view")
            }
            Unknown::KubeletReason(c) => {
                write!(
                    f,
                    "{c}: waiting for a reason only kubelet knows (kept from the API)"
                )
            }
            Unknown::Termination => f.write_str(
                "deleted pod: terminated once its sandbox is stopped with nothing running",
            ),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ComputedStatus {
    pub status: PodStatus,
    pub unknown: Vec<Unknown>,
}

pub(crate) fn to_time(t: SystemTime) -> Time {
    Time(Timestamp::try_from(t).unwrap_or(Timestamp::UNIX_EPOCH))
}

/// `t` in whole seconds, UTC, as the API writes times (`2026-12-02T10:00:00Z`: what jiff and
/// k8s-openapi's `Time` give). Formatted here for the years 1970 to 9999: the fast path formats
/// two times per death on the real-time reader's thread, where jiff's general formatter (k8s
/// -openapi's parses its format string at every call) took about 40 µs of cold code.
pub(crate) fn rfc3339(t: SystemTime) -> String {
    let mut s = String::with_capacity(20);
    rfc3339_into(t, &mut s);
    s
}

/// [`rfc3339`] appended to `out`.
pub(crate) fn rfc3339_into(t: SystemTime, out: &mut String) {
    let Some(secs) = t
        .duration_since(std::time::UNIX_EPOCH)
        .ok()
        .map(|d| d.as_secs())
        .filter(|s| *s < 253_402_300_800)
    else {
        let ts = Timestamp::try_from(t).unwrap_or(Timestamp::UNIX_EPOCH);
        let whole = Timestamp::from_second(ts.as_second()).unwrap_or(ts);
        out.push_str(&whole.to_string());
        return;
    };
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Days to the civil date (H. Hinnant's `civil_from_days`, for days since 1970 only).
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    // Digits placed by hand, for the reason above (`format!`'s padding is core::fmt).
    let mut b = *b"0000-00-00T00:00:00Z";
    for (at, width, v) in [
        (0, 4, year),
        (5, 2, month),
        (8, 2, day),
        (11, 2, rem / 3600),
        (14, 2, rem / 60 % 60),
        (17, 2, rem % 60),
    ] {
        let mut v = v;
        for i in (at..at + width).rev() {
            b[i] = b'0' + (v % 10) as u8;
            v /= 10;
        }
    }
    // ASCII digits and separators only.
    out.extend(b.iter().map(|&c| char::from(c)));
}

/// The status kubelet would write for this pod, with the kernel's account and the observer's
/// conditions.
pub(crate) fn compute_status(inp: &StatusInputs<'_>) -> ComputedStatus {
    let api = inp.pod.and_then(|p| p.status.as_ref());
    let empty = PodStatus::default();
    let old = inp.previous.or(api).unwrap_or(&empty);
    let mut unknown = Vec::new();
    let mut status = match inp.pod.filter(|p| p.spec.is_some()) {
        Some(pod) => {
            let backoff = BackOff::new(inp.view, inp.now, api);
            let prober = AgentProber;
            let gen = Generate {
                pod,
                view: inp.view,
                previous: inp.previous,
                now: inp.now,
                runtime: inp.runtime,
                types: inp.types,
                pod_is_terminal: agent_pod_is_terminal(pod, inp.view, &mut unknown),
                sandboxes: agent_sandboxes(inp.view, &mut unknown),
                reasons: &backoff,
                prober: &prober,
            };
            let status = generate_api_pod_status(&gen, &mut unknown);
            unknown.extend(backoff.kept.take().into_iter().map(Unknown::KubeletReason));
            status
        }
        None => without_spec(inp, old, &mut unknown),
    };

    // Not the view's to say: kept from the API (kubelet, the API server or a controller wrote
    // them). `patch::COMPUTED_KEYS` never names them.
    if let Some(api) = api {
        status.pod_ip = api.pod_ip.clone();
        status.pod_ips = api.pod_ips.clone();
        status.host_ip = api.host_ip.clone();
        status.host_ips = api.host_ips.clone();
        status.qos_class = api.qos_class.clone();
        status.nominated_node_name = api.nominated_node_name.clone();
        status.resource_claim_statuses = api.resource_claim_statuses.clone();
        status.extended_resource_claim_status = api.extended_resource_claim_status.clone();
        status.node_allocatable_resource_claim_statuses =
            api.node_allocatable_resource_claim_statuses.clone();
        status.ephemeral_container_statuses = api.ephemeral_container_statuses.clone();
        status.resize = api.resize.clone();
        status.resources = api.resources.clone();
        status.allocated_resources = api.allocated_resources.clone();
        status.volume_health = api.volume_health.clone();
    }
    unknown.push(Unknown::PodIps);

    // The status manager's `SetPodStatus` (`CalculatePodStatusObservedGeneration`) and
    // `updateStatusInternal`: the pod's generation, never below the last status's; nor below
    // the API's, so that a patch never deletes it.
    status.observed_generation = [
        inp.pod.and_then(observed_generation),
        old.observed_generation,
        api.and_then(|a| a.observed_generation),
    ]
    .into_iter()
    .flatten()
    .filter(|g| *g != 0)
    .max();

    // kubelet's status manager keeps the start time across updates.
    status.start_time = old
        .start_time
        .clone()
        .or_else(|| inp.view.created_at.map(to_time))
        .or_else(|| Some(to_time(inp.now)));
    ComputedStatus { status, unknown }
}

/// kubelet's prober manager, `UpdatePodStatus`: fills `started` and `ready`.
pub(crate) trait Prober {
    fn update(
        &self,
        pod: &Pod,
        status: &mut PodStatus,
        old: &PodStatus,
        unknown: &mut Vec<Unknown>,
    );
}

/// The agent's prober: no probe means started and ready while running; a probe's result is
/// kubelet's, taken from the old status of the same container instance (said as unknown).
struct AgentProber;

impl Prober for AgentProber {
    fn update(
        &self,
        pod: &Pod,
        status: &mut PodStatus,
        old: &PodStatus,
        unknown: &mut Vec<Unknown>,
    ) {
        let Some(spec) = pod.spec.as_ref() else {
            return;
        };
        let no_init = Vec::new();
        let lists = [
            (
                &spec.containers,
                status.container_statuses.as_mut(),
                old.container_statuses.as_deref(),
                false,
            ),
            (
                spec.init_containers.as_ref().unwrap_or(&no_init),
                status.init_container_statuses.as_mut(),
                old.init_container_statuses.as_deref(),
                true,
            ),
        ];
        for (specs, list, old, init) in lists {
            for s in list.into_iter().flatten() {
                let Some(c) = specs.iter().find(|c| c.name == s.name) else {
                    continue;
                };
                let o = old.unwrap_or(&[]).iter().find(|o| o.name == s.name);
                probes(c, s, o, init && !is_sidecar(c), unknown);
            }
        }
    }
}

/// The waiting reasons kubelet's reason cache holds from its own work, which neither the kernel
/// nor the runtime can tell: image pulls (`pkg/kubelet/images`), the container's configuration
/// (secrets, config maps, user checks), hooks, and a create or start the runtime refused
/// (`pkg/kubelet/container`). A container waiting for one of them keeps it as kubelet wrote it.
pub(crate) const KUBELET_REASONS: &[&str] = &[
    "ErrImagePull",
    "ImagePullBackOff",
    "ErrImageNeverPull",
    "InvalidImageName",
    "ImageInspectError",
    "RegistryUnavailable",
    "SignatureValidationFailed",
    "CreateContainerConfigError",
    "PreCreateHookError",
    "CreateContainerError",
    "PreStartHookError",
    "PostStartHookError",
    "RunContainerError",
];

/// Of [`KUBELET_REASONS`], those of a container created that did not start: its start or its
/// pre-start hook failed (the others come before the runtime creates it).
const START_REASONS: &[&str] = &["PreStartHookError", "RunContainerError"];

/// The agent's reason cache: kubelet's back-off, from the kernel's exit times; and, for what only
/// kubelet knows ([`KUBELET_REASONS`]), the reason kubelet wrote to the API.
struct BackOff<'a> {
    view: &'a PodView,
    now: SystemTime,
    /// `name_namespace(uid)`, kubelet's `format.Pod`.
    pod_label: String,
    /// The status as kubelet last wrote it.
    api: Option<&'a PodStatus>,
    /// Containers given kubelet's reason, for [`Unknown::KubeletReason`].
    kept: std::cell::RefCell<Vec<String>>,
}

impl<'a> BackOff<'a> {
    fn new(view: &'a PodView, now: SystemTime, api: Option<&'a PodStatus>) -> Self {
        BackOff {
            view,
            now,
            pod_label: format!("{}_{}({})", view.name, view.namespace, view.uid),
            api,
            kept: Default::default(),
        }
    }

    /// kubelet's own reason for `container`'s wait, where the API has one of `reasons`.
    fn kubelets_of(&self, container: &str, reasons: &[&str]) -> Option<(String, Option<String>)> {
        let api = self.api?;
        let w = [&api.container_statuses, &api.init_container_statuses]
            .into_iter()
            .flatten()
            .flatten()
            .find(|s| s.name == container)?
            .state
            .as_ref()?
            .waiting
            .as_ref()?;
        let reason = w.reason.as_deref()?;
        reasons.contains(&reason).then(|| {
            self.kept.borrow_mut().push(container.to_string());
            (reason.to_string(), w.message.clone())
        })
    }

    /// kubelet's own reason for `container`'s wait, where the API has one.
    fn kubelets(&self, container: &str) -> Option<(String, Option<String>)> {
        self.kubelets_of(container, KUBELET_REASONS)
    }
}

impl ReasonCache for BackOff<'_> {
    fn get(&self, container: &str) -> Option<(String, Option<String>)> {
        let cur = self
            .view
            .containers
            .iter()
            .filter(|c| c.name == container)
            .max_by_key(|c| (c.created_at, c.restart_count));
        let Some(cur) = cur else {
            // Never created: whatever held it back is kubelet's to say.
            return self.kubelets(container);
        };
        match cur.phase {
            ContainerPhase::Exited => {}
            // Created and not started: kubelet restarts it, waiting for why its start failed.
            ContainerPhase::Created => return self.kubelets_of(container, START_REASONS),
            ContainerPhase::Running | ContainerPhase::Unknown => return None,
        }
        let Some((delay, finished)) = backoff(cur).zip(cur.finished_at) else {
            return self.kubelets(container);
        };
        let until = finished + delay;
        if self.now >= until {
            // Out of back-off, kubelet restarts it; a failed restart is kubelet's to say.
            return self.kubelets(container);
        }
        Some((
            CRASH_LOOP_BACK_OFF.to_string(),
            Some(format!(
                "back-off {} restarting failed container={container} pod={}",
                go_duration(delay.as_secs()),
                self.pod_label
            )),
        ))
    }
}

/// Go's `time.Duration` text for whole seconds: `10s`, `1m20s`, `5m0s`.
pub(crate) fn go_duration(secs: u64) -> String {
    match secs {
        0..60 => format!("{secs}s"),
        60..3600 => format!("{}m{}s", secs / 60, secs % 60),
        _ => format!("{}h{}m{}s", secs / 3600, secs % 3600 / 60, secs % 60),
    }
}

/// kubelet's `podIsTerminal` is its pod worker's word: the pod was terminated (all containers
/// stopped after a deletion, an eviction, or a terminal phase). The agent sees the end of that
/// only: a deleted pod whose sandbox is stopped with nothing running.
fn agent_pod_is_terminal(pod: &Pod, view: &PodView, unknown: &mut Vec<Unknown>) -> bool {
    if pod.metadata.deletion_timestamp.is_none() {
        return false;
    }
    unknown.push(Unknown::Termination);
    !view.sandbox_ready
        && view
            .current()
            .all(|c| matches!(c.phase, ContainerPhase::Exited | ContainerPhase::Unknown))
}

/// The view lists the newest sandbox without its network status.
fn agent_sandboxes(view: &PodView, unknown: &mut Vec<Unknown>) -> Vec<Sandbox> {
    unknown.push(Unknown::SandboxNetwork);
    vec![Sandbox {
        ready: view.sandbox_ready,
        ip: None,
        host_network: None,
    }]
}

/// kubelet's `generateAPIPodStatus` (with the status manager's `mergePodStatus`): the inputs
/// kubelet has from its own state are fields, so its test cases can give them.
pub(crate) struct Generate<'a> {
    /// With its spec.
    pub pod: &'a Pod,
    pub view: &'a PodView,
    /// The status last computed (kubelet's status cache); the API's when `None`.
    pub previous: Option<&'a PodStatus>,
    pub now: SystemTime,
    pub runtime: &'a str,
    pub types: &'a ConditionTypes,
    pub pod_is_terminal: bool,
    /// Newest first.
    pub sandboxes: Vec<Sandbox>,
    pub reasons: &'a dyn ReasonCache,
    pub prober: &'a dyn Prober,
}

/// Conditions kubelet owns that the agent does not compute (in-place resize: kubelet's status
/// manager holds them, each with the generation of its resize): kept as the API has them, but
/// for a terminal pod (kubelet's `determinePodResizeStatus` clears them).
const KEPT_KUBELET_CONDITIONS: &[&str] = &["PodResizePending", "PodResizeInProgress"];

pub(crate) fn generate_api_pod_status(g: &Generate<'_>, unknown: &mut Vec<Unknown>) -> PodStatus {
    let pod = g.pod;
    let empty_spec = PodSpec::default();
    let spec = pod.spec.as_ref().unwrap_or(&empty_spec);
    let empty = PodStatus::default();
    let api = pod.status.as_ref().unwrap_or(&empty);
    let old = g.previous.unwrap_or(api);
    let conv = Convert {
        pod,
        view: g.view,
        runtime: g.runtime,
        reasons: g.reasons,
        pod_restarting: should_all_containers_restart(pod, g.view, Some(old)),
    };
    let init_specs: &[Container] = spec.init_containers.as_deref().unwrap_or(&[]);
    let has_init = !init_specs.is_empty();
    let mut s = PodStatus {
        container_statuses: Some(conv.statuses(
            &spec.containers,
            old.container_statuses.as_deref().unwrap_or(&[]),
            has_init,
            false,
        )),
        init_container_statuses: has_init.then(|| {
            conv.statuses(
                init_specs,
                old.init_container_statuses.as_deref().unwrap_or(&[]),
                has_init,
                true,
            )
        }),
        ..Default::default()
    };
    let lists = s
        .container_statuses
        .iter()
        .chain(s.init_container_statuses.iter());
    for c in lists.flatten() {
        if c.image_id.is_empty() && !conv.instances(&c.name).is_empty() {
            unknown.push(Unknown::ImageId(c.name.clone()));
        }
    }
    // kubelet probes after the phase and its phase reads the `started` of its previous sync;
    // the agent has its prober's answer at once, and uses it (no later sync would correct it).
    g.prober.update(pod, &mut s, old, unknown);

    let all: Vec<ContainerStatus> = s
        .container_statuses
        .iter()
        .chain(s.init_container_statuses.iter())
        .flatten()
        .cloned()
        .collect();
    // kubelet's HasAnyActiveRegularContainerStarted: a regular container exists, in any state.
    let has_initialized = spec
        .containers
        .iter()
        .any(|c| g.view.containers.iter().any(|v| v.name == c.name));
    let mut phase = get_phase(pod, &all, g.pod_is_terminal, has_initialized);
    let terminal = |p: Option<&str>| matches!(p, Some("Succeeded" | "Failed"));
    if !terminal(Some(&phase)) {
        if terminal(old.phase.as_deref()) {
            phase = old.phase.clone().unwrap_or_default();
        } else if terminal(api.phase.as_deref()) {
            phase = api.phase.clone().unwrap_or_default();
        }
    }
    if old.phase.as_deref() == Some(phase.as_str()) {
        let non_empty = |v: &Option<String>| v.clone().filter(|r| !r.is_empty());
        s.reason = non_empty(&old.reason).or_else(|| non_empty(&api.reason));
        s.message = non_empty(&old.message).or_else(|| non_empty(&api.message));
    }
    // No transition out of the API's terminal phase.
    if terminal(api.phase.as_deref()) && api.phase.as_deref() != Some(phase.as_str()) {
        phase = api.phase.clone().unwrap_or_default();
    }
    s.phase = Some(phase.clone());

    // Conditions: everything not kubelet's as the API has it (the observer's own replaced by the
    // computed ones), the resize conditions, the old status's DisruptionTarget, then kubelet's
    // in its order.
    let old_conditions = old.conditions.as_deref().unwrap_or(&[]);
    let ours = observer_conditions(Some(pod), g.view, old_conditions, g.types, g.now);
    let kept = |c: &&PodCondition| {
        !kubelet_owns(&c.type_)
            || (KEPT_KUBELET_CONDITIONS.contains(&c.type_.as_str()) && !g.pod_is_terminal)
    };
    let mut conditions: Vec<PodCondition> = api
        .conditions
        .iter()
        .flatten()
        .filter(kept)
        .filter(|c| !ours.iter().any(|o| o.type_ == c.type_))
        .cloned()
        .collect();
    conditions.extend(ours);
    if let Some(d) = old_conditions.iter().find(|c| c.type_ == DISRUPTION_TARGET) {
        match conditions.iter_mut().find(|c| c.type_ == DISRUPTION_TARGET) {
            Some(c) => *c = d.clone(),
            None => conditions.push(d.clone()),
        }
    }
    let init_first: Vec<ContainerStatus> = s
        .init_container_statuses
        .iter()
        .chain(s.container_statuses.iter())
        .flatten()
        .cloned()
        .collect();
    let kubelet_conditions = [
        ready_to_start_containers_condition(pod, &g.sandboxes),
        initialized_condition(pod, old, Some(&init_first), &phase),
    ];
    for c in kubelet_conditions {
        conditions.push(keep_transition(c, old_conditions, g.now));
    }
    // Ready reads the conditions so far (readiness gates), ContainersReady comes after it.
    let ready = pod_ready_condition(pod, &conditions, Some(&init_first), &phase);
    let restarting = all_containers_could_restart(spec)
        .then(|| all_containers_restarting_condition(pod, g.view, Some(old), &phase));
    let kubelet_conditions = [
        Some(ready),
        Some(containers_ready_condition(pod, Some(&init_first), &phase)),
        Some(condition(pod, "PodScheduled", true, None, None)),
        restarting,
    ];
    for c in kubelet_conditions.into_iter().flatten() {
        conditions.push(keep_transition(c, old_conditions, g.now));
    }
    // A terminal pod is never Ready (the status manager's mergePodStatus, issue 108594).
    if terminal(Some(&phase)) {
        for c in conditions.iter_mut() {
            if (c.type_ == "Ready" || c.type_ == "ContainersReady") && c.status == "True" {
                let t = terminal_ready_condition(pod, &c.type_, &phase);
                *c = keep_transition(t, old_conditions, g.now);
            }
        }
    }
    s.conditions = Some(conditions);
    let ephemeral = api
        .ephemeral_container_statuses
        .as_ref()
        .map_or(0, Vec::len);
    bound_termination_messages(&mut s, ephemeral);
    s
}

/// kubelet's `MaxPodTerminationMessageLogLength`: what all of a pod's termination messages may
/// hold together.
const MAX_POD_TERMINATION_MESSAGES: usize = 12 * 1024;

/// kubelet's status manager shares [`MAX_POD_TERMINATION_MESSAGES`] among the pod's container
/// statuses (ephemeral ones counted) and cuts each terminated message to its share, in `state`
/// and `lastState` alike. kubelet cuts at a byte; the agent at the character boundary below it,
/// where kubelet's cut leaves a broken character the API shows as U+FFFD.
fn bound_termination_messages(s: &mut PodStatus, ephemeral: usize) {
    let lists = [&mut s.container_statuses, &mut s.init_container_statuses];
    let count: usize = lists
        .iter()
        .map(|l| l.as_ref().map_or(0, Vec::len))
        .sum::<usize>()
        + ephemeral;
    let share = MAX_POD_TERMINATION_MESSAGES / count.max(1);
    for c in lists.into_iter().flatten().flatten() {
        for state in [c.state.as_mut(), c.last_state.as_mut()]
            .into_iter()
            .flatten()
        {
            if let Some(m) = state.terminated.as_mut().and_then(|t| t.message.as_mut()) {
                if m.len() > share {
                    let mut end = share;
                    while !m.is_char_boundary(end) {
                        end -= 1;
                    }
                    m.truncate(end);
                }
            }
        }
    }
}

/// Without the pod (no API): the containers the runtime has, the phase where it does not
/// depend on the restart policy, and what that leaves open said.
fn without_spec(inp: &StatusInputs<'_>, old: &PodStatus, unknown: &mut Vec<Unknown>) -> PodStatus {
    unknown.push(Unknown::PodSpec);
    let view = inp.view;
    let mut names: Vec<&str> = Vec::new();
    for c in &view.containers {
        if !names.contains(&c.name.as_str()) {
            names.push(&c.name);
        }
    }
    let pod = Pod {
        spec: Some(PodSpec {
            containers: names
                .iter()
                .map(|n| Container {
                    name: n.to_string(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let old_statuses: Vec<ContainerStatus> = old
        .container_statuses
        .iter()
        .chain(old.init_container_statuses.iter())
        .flatten()
        .cloned()
        .collect();
    let conv = Convert {
        pod: &pod,
        view,
        runtime: inp.runtime,
        reasons: &NoReasons,
        pod_restarting: false,
    };
    let mut statuses = conv.statuses(
        pod.spec.as_ref().map_or(&[][..], |s| &s.containers),
        &old_statuses,
        false,
        false,
    );
    for s in &mut statuses {
        // Probes are unknown without the spec: started unknown, ready not claimed.
        s.started = None;
        s.ready = false;
        if s.state.as_ref().is_some_and(|st| st.running.is_some()) {
            unknown.push(Unknown::Readiness(s.name.clone()));
        }
    }
    let (mut running, mut waiting) = (0, 0);
    for s in &statuses {
        match s.state.as_ref() {
            Some(st) if st.running.is_some() => running += 1,
            Some(st) if st.terminated.is_some() => {}
            _ => waiting += 1,
        }
    }
    let phase = if waiting > 0 || statuses.is_empty() {
        Some("Pending".to_string())
    } else if running > 0 {
        Some("Running".to_string())
    } else {
        unknown.push(Unknown::Phase);
        None
    };
    let old_conditions = old.conditions.as_deref().unwrap_or(&[]);
    let mut conditions = observer_conditions(None, view, old_conditions, inp.types, inp.now);
    let sandboxes = agent_sandboxes(view, unknown);
    for c in [
        ready_to_start_containers_condition(&pod, &sandboxes),
        condition(&pod, "PodScheduled", true, None, None),
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

struct NoReasons;

impl ReasonCache for NoReasons {
    fn get(&self, _: &str) -> Option<(String, Option<String>)> {
        None
    }
}

/// The reason of an exited instance, with the kernel's evidence: `OOMKilled` only when the
/// container's init was the victim (or died of SIGKILL while the OOM killer worked in its
/// container: a group kill); a child killed under an init that exited by itself is the init's
/// own exit.
pub(crate) fn terminated_reason(v: &ContainerView) -> String {
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

/// kubelet's back-off before restarting this dead instance, if any (kuberuntime's `doBackOff`
/// on kubelet's `flowcontrol.Backoff`): the first death restarts at once (no entry yet); then
/// 10 s doubling to 300 s; an instance that ended more than 600 s after kubelet restarted it
/// (the entry's last update, when kubelet created it) starts over. From the creation, not the
/// start: an instance that never started (StartError) has no start time of its own.
pub(crate) fn backoff(v: &ContainerView) -> Option<std::time::Duration> {
    let ran = match (v.created_at.or(v.started_at), v.finished_at) {
        (Some(s), Some(f)) => f.duration_since(s).unwrap_or_default(),
        _ => std::time::Duration::ZERO,
    };
    if v.restart_count == 0 || ran > std::time::Duration::from_secs(BACKOFF_RESET_SECS) {
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

mod kubelet;

#[cfg(test)]
mod tests;
