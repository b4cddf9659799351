//! kubelet's status functions, one for one, on the API types: `getPhase`,
//! `convertToAPIContainerStatuses`, `status.Generate*Condition`, `PodSandboxChanged`,
//! `ShouldContainerBeRestarted`, `ContainerShouldRestart`. Inputs kubelet takes from its own
//! state (the pod worker's `podIsTerminal`, the prober, the reason cache) are parameters here,
//! so that kubelet's test cases run against them as they are written; `compute.rs` says where
//! the agent's values for them come from.
use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, Pod, PodCondition, PodSpec,
};

use super::{to_time, RestartPolicy, CONTAINER_CREATING, POD_INITIALIZING, STATUS_UNKNOWN};
use crate::reconcile::{ContainerPhase, ContainerView, PodView};
use crate::status::conditions::is_sidecar;

/// The reason kubelet 1.35+ gives containers removed to restart all of a pod's containers
/// (RestartAllContainers). The agent writes it never; a status that carries it counts as
/// restarting, as in kubelet's `getPhase`.
pub(crate) const RESTARTING_ALL_CONTAINERS: &str = "RestartingAllContainers";

/// kubelet's condition reasons (pkg/kubelet/status).
pub(crate) const UNKNOWN_CONTAINER_STATUSES: &str = "UnknownContainerStatuses";
pub(crate) const POD_COMPLETED: &str = "PodCompleted";
pub(crate) const POD_FAILED: &str = "PodFailed";
pub(crate) const CONTAINERS_NOT_READY: &str = "ContainersNotReady";
pub(crate) const CONTAINERS_NOT_INITIALIZED: &str = "ContainersNotInitialized";
pub(crate) const READINESS_GATES_NOT_READY: &str = "ReadinessGatesNotReady";

fn state(s: &ContainerStatus) -> ContainerState {
    s.state.clone().unwrap_or_default()
}

fn last_terminated(s: &ContainerStatus) -> Option<&ContainerStateTerminated> {
    s.last_state.as_ref().and_then(|l| l.terminated.as_ref())
}

fn find<'s>(statuses: &'s [ContainerStatus], name: &str) -> Option<&'s ContainerStatus> {
    statuses.iter().find(|s| s.name == name)
}

/// `podutil.ContainerShouldRestart`: the container's own restart policy and rules
/// (ContainerRestartRules, 1.34) before the pod's.
pub(crate) fn container_should_restart(c: &Container, spec: &PodSpec, exit_code: i32) -> bool {
    if let Some(policy) = c.restart_policy.as_deref() {
        let rule = c.restart_policy_rules.iter().flatten().find(|r| {
            r.exit_codes.as_ref().is_some_and(|e| {
                let listed = e.values.iter().flatten().any(|v| *v == exit_code);
                match e.operator.as_str() {
                    "In" => listed,
                    "NotIn" => !listed,
                    _ => false,
                }
            })
        });
        if let Some(rule) = rule {
            return matches!(rule.action.as_str(), "Restart" | "RestartAllContainers");
        }
        match policy {
            "Always" => return true,
            "OnFailure" => return exit_code != 0,
            "Never" => return false,
            _ => {}
        }
    }
    match RestartPolicy::of(spec) {
        RestartPolicy::Always => true,
        RestartPolicy::OnFailure => exit_code != 0,
        RestartPolicy::Never => false,
    }
}

/// Whether a terminated state (of `c`, exit `code`, reason `reason`) will be restarted: its
/// policy says so, or kubelet is restarting all the pod's containers.
fn restartable(c: &Container, spec: &PodSpec, t: &ContainerStateTerminated) -> bool {
    container_should_restart(c, spec, t.exit_code)
        || t.reason.as_deref() == Some(RESTARTING_ALL_CONTAINERS)
}

/// kubetypes.IsStaticPod: a pod from a file or URL source, seen through its mirror.
fn is_static(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("kubernetes.io/config.source"))
        .is_some_and(|s| s != "api")
}

/// kubelet's `getPhase`, with per-container restart policies (ContainerRestartRules): for a
/// pod without them it is the pod-level rule exactly.
pub(crate) fn get_phase(
    pod: &Pod,
    info: &[ContainerStatus],
    pod_is_terminal: bool,
    pod_has_initialized: bool,
) -> String {
    let empty = PodSpec::default();
    let spec = pod.spec.as_ref().unwrap_or(&empty);
    let init_specs = spec.init_containers.as_deref().unwrap_or(&[]);
    let mut pending_sidecars = 0;
    let mut pending_init = 0;
    let mut failed_init_not_restartable = 0;
    for c in init_specs.iter().filter(|c| !is_sidecar(c)) {
        let Some(s) = find(info, &c.name) else {
            pending_init += 1;
            continue;
        };
        let st = state(s);
        if st.running.is_some() {
            pending_init += 1;
        } else if let Some(t) = &st.terminated {
            if t.exit_code != 0 && !restartable(c, spec, t) {
                failed_init_not_restartable += 1;
            }
        } else if st.waiting.is_some() {
            match last_terminated(s) {
                Some(t) if t.exit_code != 0 && !restartable(c, spec, t) => {
                    failed_init_not_restartable += 1
                }
                Some(_) => {}
                None => pending_init += 1,
            }
        } else {
            pending_init += 1;
        }
    }
    let (mut unknown, mut running, mut waiting) = (0, 0, 0);
    let (mut stopped, mut stopped_not_restartable, mut succeeded) = (0, 0, 0);
    for c in init_specs.iter().filter(|c| is_sidecar(c)) {
        let Some(s) = find(info, &c.name) else {
            unknown += 1;
            continue;
        };
        let st = state(s);
        if st.running.is_some() {
            if s.started != Some(true) {
                pending_sidecars += 1;
            }
            running += 1;
        } else if st.terminated.is_some() {
            // A stopped sidecar does not count towards the phase.
        } else if st.waiting.is_some() {
            if last_terminated(s).is_none() {
                pending_sidecars += 1;
                waiting += 1;
            }
        } else {
            pending_sidecars += 1;
            unknown += 1;
        }
    }
    for c in &spec.containers {
        let Some(s) = find(info, &c.name) else {
            unknown += 1;
            continue;
        };
        let st = state(s);
        if st.running.is_some() {
            running += 1;
        } else if let Some(t) = &st.terminated {
            stopped += 1;
            if !restartable(c, spec, t) {
                stopped_not_restartable += 1;
            }
            if t.exit_code == 0 {
                succeeded += 1;
            }
        } else if st.waiting.is_some() {
            match last_terminated(s) {
                Some(t) => {
                    stopped += 1;
                    if !restartable(c, spec, t) {
                        stopped_not_restartable += 1;
                    }
                }
                None => waiting += 1,
            }
        } else {
            unknown += 1;
        }
    }
    if failed_init_not_restartable > 0 {
        return "Failed".into();
    }
    let phase = if pending_init > 0 || (pending_sidecars > 0 && !pod_has_initialized) || waiting > 0
    {
        "Pending"
    } else if running > 0 && unknown == 0 {
        "Running"
    } else if running == 0 && stopped > 0 && unknown == 0 {
        if pod_is_terminal && !is_static(pod) {
            if stopped == succeeded {
                "Succeeded"
            } else {
                "Failed"
            }
        } else if stopped != stopped_not_restartable {
            // At least one of them is being restarted.
            "Running"
        } else if stopped == succeeded {
            "Succeeded"
        } else {
            "Failed"
        }
    } else {
        "Pending"
    };
    phase.into()
}

/// The runtime's account of the pod's sandbox(es), as kubelet's `PodSandboxChanged` reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Sandbox {
    pub ready: bool,
    /// The sandbox's IP; `None`: not known (the agent lists sandboxes without their network
    /// status).
    pub ip: Option<String>,
    /// The sandbox's network namespace is the node's; `None`: not known.
    pub host_network: Option<bool>,
}

/// kubelet's `PodSandboxChanged`: whether a new sandbox is needed. `sandboxes` newest first.
pub(crate) fn pod_sandbox_changed(pod: &Pod, sandboxes: &[Sandbox]) -> bool {
    let Some(newest) = sandboxes.first() else {
        return true;
    };
    let host_network = pod
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false);
    sandboxes.iter().filter(|s| s.ready).count() > 1
        || !newest.ready
        || newest.host_network.is_some_and(|h| h != host_network)
        || (!host_network && newest.ip.as_deref() == Some(""))
}

pub(super) fn condition(
    type_: &str,
    ok: bool,
    reason: Option<&str>,
    message: Option<String>,
) -> PodCondition {
    PodCondition {
        type_: type_.to_string(),
        status: if ok { "True" } else { "False" }.to_string(),
        reason: reason.map(str::to_string),
        message,
        ..Default::default()
    }
}

/// `status.GeneratePodReadyToStartContainersCondition` as kubelet 1.34 writes it (a False
/// condition without reason or message).
pub(crate) fn ready_to_start_containers_condition(
    pod: &Pod,
    sandboxes: &[Sandbox],
) -> PodCondition {
    condition(
        "PodReadyToStartContainers",
        !pod_sandbox_changed(pod, sandboxes),
        None,
        None,
    )
}

/// Go's `fmt.Sprintf("%s", []string)`: `[a b]`.
fn go_list(names: &[String]) -> String {
    format!("[{}]", names.join(" "))
}

/// `status.GenerateContainersReadyCondition`. `statuses`: `None` is Go's nil (no statuses at
/// all), apart from an empty list.
pub(crate) fn containers_ready_condition(
    pod: &Pod,
    statuses: Option<&[ContainerStatus]>,
    phase: &str,
) -> PodCondition {
    let Some(statuses) = statuses else {
        return condition(
            "ContainersReady",
            false,
            Some(UNKNOWN_CONTAINER_STATUSES),
            None,
        );
    };
    let empty = PodSpec::default();
    let spec = pod.spec.as_ref().unwrap_or(&empty);
    let mut unknown = Vec::new();
    let mut unready = Vec::new();
    let sidecars = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| is_sidecar(c));
    for c in sidecars.chain(spec.containers.iter()) {
        match find(statuses, &c.name) {
            Some(s) if !s.ready => unready.push(c.name.clone()),
            Some(_) => {}
            None => unknown.push(c.name.clone()),
        }
    }
    if (phase == "Succeeded" && unknown.is_empty()) || phase == "Failed" {
        return terminal_ready_condition("ContainersReady", phase);
    }
    let mut msgs = Vec::new();
    if !unknown.is_empty() {
        msgs.push(format!(
            "containers with unknown status: {}",
            go_list(&unknown)
        ));
    }
    if !unready.is_empty() {
        msgs.push(format!(
            "containers with unready status: {}",
            go_list(&unready)
        ));
    }
    if msgs.is_empty() {
        condition("ContainersReady", true, None, None)
    } else {
        condition(
            "ContainersReady",
            false,
            Some(CONTAINERS_NOT_READY),
            Some(msgs.join(", ")),
        )
    }
}

/// `generate{ContainersReady,PodReady}ConditionForTerminalPhase`.
pub(crate) fn terminal_ready_condition(type_: &str, phase: &str) -> PodCondition {
    let reason = match phase {
        "Failed" => Some(POD_FAILED),
        "Succeeded" => Some(POD_COMPLETED),
        _ => None,
    };
    condition(type_, false, reason, None)
}

/// `status.GeneratePodReadyCondition`: ContainersReady, then every readiness gate's condition
/// True.
pub(crate) fn pod_ready_condition(
    pod: &Pod,
    conditions: &[PodCondition],
    statuses: Option<&[ContainerStatus]>,
    phase: &str,
) -> PodCondition {
    let containers_ready = containers_ready_condition(pod, statuses, phase);
    if containers_ready.status != "True" {
        return PodCondition {
            type_: "Ready".into(),
            ..containers_ready
        };
    }
    let mut msgs = Vec::new();
    let gates = pod.spec.as_ref().and_then(|s| s.readiness_gates.as_ref());
    for gate in gates.into_iter().flatten() {
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
            Some(READINESS_GATES_NOT_READY),
            Some(msgs.join(", ")),
        )
    }
}

/// `kubecontainer.HasAnyRegularContainerStarted`: a regular container running or terminated.
pub(crate) fn has_any_regular_container_started(
    spec: &PodSpec,
    statuses: &[ContainerStatus],
) -> bool {
    statuses.iter().any(|s| {
        let st = state(s);
        spec.containers.iter().any(|c| c.name == s.name)
            && (st.running.is_some() || st.terminated.is_some())
    })
}

/// `status.GeneratePodInitializedCondition`. A regular init container is done when ready, a
/// sidecar when started; a regular container that ran means the pod was initialized.
pub(crate) fn initialized_condition(
    pod: &Pod,
    statuses: Option<&[ContainerStatus]>,
    phase: &str,
) -> PodCondition {
    let empty = PodSpec::default();
    let spec = pod.spec.as_ref().unwrap_or(&empty);
    let init_specs = spec.init_containers.as_deref().unwrap_or(&[]);
    let statuses = match statuses {
        Some(s) => s,
        None if !init_specs.is_empty() => {
            return condition("Initialized", false, Some(UNKNOWN_CONTAINER_STATUSES), None)
        }
        None => &[],
    };
    let mut unknown = Vec::new();
    let mut incomplete = Vec::new();
    for c in init_specs {
        match find(statuses, &c.name) {
            None => unknown.push(c.name.clone()),
            Some(s) => {
                let done = if is_sidecar(c) {
                    s.started == Some(true)
                } else {
                    s.ready
                };
                if !done {
                    incomplete.push(c.name.clone());
                }
            }
        }
    }
    if phase == "Succeeded" && unknown.is_empty() {
        return condition("Initialized", true, Some(POD_COMPLETED), None);
    }
    if has_any_regular_container_started(spec, statuses) {
        return condition("Initialized", true, None, None);
    }
    let mut msgs = Vec::new();
    if !unknown.is_empty() {
        msgs.push(format!(
            "containers with unknown status: {}",
            go_list(&unknown)
        ));
    }
    if !incomplete.is_empty() {
        msgs.push(format!(
            "containers with incomplete status: {}",
            go_list(&incomplete)
        ));
    }
    if msgs.is_empty() {
        condition("Initialized", true, None, None)
    } else {
        condition(
            "Initialized",
            false,
            Some(CONTAINERS_NOT_INITIALIZED),
            Some(msgs.join(", ")),
        )
    }
}

/// kubelet's reason cache: the last error of a container's start (`CrashLoopBackOff` while it
/// backs off), as (reason, message).
pub(crate) trait ReasonCache {
    fn get(&self, container: &str) -> Option<(String, Option<String>)>;
}

/// What convertToAPIContainerStatuses reads besides the lists.
pub(crate) struct Convert<'a> {
    pub pod: &'a Pod,
    pub view: &'a PodView,
    /// Scheme of container ids: `containerd` gives `containerd://<id>`.
    pub runtime: &'a str,
    pub reasons: &'a dyn ReasonCache,
}

impl Convert<'_> {
    fn deleting(&self) -> bool {
        self.pod.metadata.deletion_timestamp.is_some()
    }

    /// The runtime's instances of a container, newest first (kubelet sorts by creation time).
    pub(super) fn instances(&self, name: &str) -> Vec<&ContainerView> {
        let mut v: Vec<&ContainerView> = self
            .view
            .containers
            .iter()
            .filter(|c| c.name == name)
            .collect();
        v.sort_by_key(|c| std::cmp::Reverse((c.created_at, c.restart_count)));
        v
    }

    pub(super) fn container_id(&self, v: &ContainerView) -> String {
        format!("{}://{}", self.runtime, v.id)
    }

    /// `kuberuntime.HasAnyRegularContainerCreated`.
    fn any_regular_created(&self) -> bool {
        let spec = self.pod.spec.as_ref();
        spec.into_iter().flat_map(|s| &s.containers).any(|c| {
            self.instances(&c.name).first().is_some_and(|v| {
                matches!(
                    v.phase,
                    ContainerPhase::Created | ContainerPhase::Running | ContainerPhase::Exited
                )
            })
        })
    }

    /// `kubecontainer.ShouldContainerBeRestarted`.
    fn should_be_restarted(&self, c: &Container) -> bool {
        if self.deleting() {
            return false;
        }
        let Some(cur) = self.instances(&c.name).first().copied() else {
            return true;
        };
        match cur.phase {
            ContainerPhase::Running => false,
            ContainerPhase::Unknown | ContainerPhase::Created => true,
            ContainerPhase::Exited => {
                let empty = PodSpec::default();
                let spec = self.pod.spec.as_ref().unwrap_or(&empty);
                container_should_restart(c, spec, cur.exit_code.unwrap_or(137))
            }
        }
    }

    /// kubelet's `convertContainerStatus`: one runtime instance.
    fn convert_one(&self, v: &ContainerView, old: Option<&ContainerStatus>) -> ContainerStatus {
        let id = self.container_id(v);
        let mut s = ContainerStatus {
            name: v.name.clone(),
            restart_count: v.restart_count as i32,
            image: v.image.clone(),
            // The view has no image digest: the API's, for this very instance.
            image_id: old
                .filter(|o| o.container_id.as_deref() == Some(id.as_str()))
                .map(|o| o.image_id.clone())
                .unwrap_or_default(),
            container_id: Some(id.clone()),
            volume_mounts: old.and_then(|o| o.volume_mounts.clone()),
            ..Default::default()
        };
        s.state = Some(match v.phase {
            ContainerPhase::Running => ContainerState {
                running: Some(ContainerStateRunning {
                    started_at: v.started_at.map(to_time),
                }),
                ..Default::default()
            },
            ContainerPhase::Created => waiting(None, None),
            ContainerPhase::Exited => ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: v.exit_code.unwrap_or(137),
                    signal: v.signal.map(i32::from),
                    reason: Some(super::terminated_reason(v)),
                    message: message(v, old, &id),
                    started_at: v.started_at.map(to_time),
                    finished_at: v.finished_at.map(to_time),
                    container_id: Some(id),
                }),
                ..Default::default()
            },
            ContainerPhase::Unknown => match old {
                Some(o) if state(o).running.is_some() => {
                    s.restart_count = o.restart_count + 1;
                    ContainerState {
                        terminated: Some(ContainerStateTerminated {
                            reason: Some(STATUS_UNKNOWN.into()),
                            message: Some(
                                "The container could not be located when the pod was terminated"
                                    .into(),
                            ),
                            exit_code: 137,
                            ..Default::default()
                        }),
                        ..Default::default()
                    }
                }
                _ => waiting(None, None),
            },
        });
        s
    }

    /// kubelet's `convertToAPIContainerStatuses` for one list (regular or init containers).
    pub(super) fn statuses(
        &self,
        containers: &[Container],
        previous: &[ContainerStatus],
        has_init: bool,
        is_init: bool,
    ) -> Vec<ContainerStatus> {
        let default_reason = if has_init {
            POD_INITIALIZING
        } else {
            CONTAINER_CREATING
        };
        let mut statuses: Vec<ContainerStatus> = containers
            .iter()
            .map(|c| {
                let mut s = ContainerStatus {
                    name: c.name.clone(),
                    image: c.image.clone().unwrap_or_default(),
                    state: Some(waiting(Some(default_reason), None)),
                    ..Default::default()
                };
                if let Some(o) = find(previous, &c.name) {
                    if state(o).terminated.is_some() {
                        s = o.clone();
                    } else {
                        s.restart_count = o.restart_count;
                        s.last_state = o.last_state.clone();
                        // kubelet writes the spec's mounts (with their recursive read-only
                        // state, the runtime's) for a container not created yet too.
                        s.volume_mounts = o.volume_mounts.clone();
                    }
                }
                s
            })
            .collect();
        // A container the runtime lost that kubelet had seen running: it terminated, how is
        // unknown, and (unless the pod is being deleted) it was restarted.
        for s in statuses.iter_mut() {
            if !self.instances(&s.name).is_empty() {
                continue;
            }
            let Some(o) = find(previous, &s.name) else {
                continue;
            };
            let os = state(o);
            if os.terminated.is_some() || os.running.is_none() {
                continue;
            }
            let default = state(s)
                .waiting
                .is_some_and(|w| w.reason.as_deref() == Some(default_reason));
            if !default || last_terminated(s).is_some() {
                continue;
            }
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
            if !self.deleting() {
                s.restart_count += 1;
            }
        }
        // The newest instance is the state, the one before it the last state.
        for s in statuses.iter_mut() {
            let old = find(previous, &s.name);
            let inst = self.instances(&s.name);
            let Some(cur) = inst.first() else { continue };
            let mut new = self.convert_one(cur, old);
            if cur.phase == ContainerPhase::Running {
                if let Some(started) = old.and_then(|o| o.started) {
                    new.started = Some(started);
                }
            }
            if let Some(prev) = inst.get(1) {
                new.last_state = self.convert_one(prev, old).state;
            }
            *s = new;
        }
        // Containers kubelet will (re)start are waiting, with the reason of their last failure.
        let any_regular_created = is_init && self.any_regular_created();
        for (c, s) in containers.iter().zip(statuses.iter_mut()) {
            let cur = self.instances(&c.name).first().copied();
            if is_init {
                if cur.is_some_and(|v| v.phase == ContainerPhase::Exited && v.exit_code == Some(0))
                {
                    continue;
                }
                // An init container the runtime forgot, once regular containers exist, ran
                // to completion (a sidecar is restarted instead).
                if cur.is_none()
                    && any_regular_created
                    && !is_sidecar(c)
                    && state(s).waiting.is_some()
                {
                    s.state = Some(ContainerState {
                        terminated: Some(ContainerStateTerminated {
                            reason: Some("Completed".into()),
                            message: Some(
                                "Unable to get init container status from container runtime \
                                 and pod has been initialized, treat it as exited normally"
                                    .into(),
                            ),
                            exit_code: 0,
                            ..Default::default()
                        }),
                        ..Default::default()
                    });
                    continue;
                }
            }
            if !self.should_be_restarted(c) {
                continue;
            }
            let Some((reason, message)) = self.reasons.get(&c.name) else {
                continue;
            };
            if state(s).terminated.is_some() {
                s.last_state = s.state.take();
            }
            s.state = Some(waiting(Some(&reason), message));
        }
        if !is_init {
            statuses.sort_by(|a, b| a.name.cmp(&b.name));
        }
        statuses
    }
}

/// A termination's message. kubelet's is the runtime's followed by `: ` and the container's own
/// termination message (its termination-log file, or its log's tail under FallbackToLogsOnError).
/// Where the agent read those files itself, its message is whole; where it could not (kubelet's
/// directories not mounted into its pod), kubelet's is kept from the API when it holds the
/// runtime's (or there is none): container statuses are an atomic list, and a `full` PATCH
/// without it would erase it.
fn message(v: &ContainerView, old: Option<&ContainerStatus>, id: &str) -> Option<String> {
    if v.message_complete {
        return v.message.clone();
    }
    let kubelets = old.and_then(|o| {
        [o.state.as_ref(), o.last_state.as_ref()]
            .into_iter()
            .flatten()
            .filter_map(|s| s.terminated.as_ref())
            .find(|t| t.container_id.as_deref() == Some(id))
            .and_then(|t| t.message.clone())
    });
    match (&v.message, kubelets) {
        (Some(runtime), Some(k)) if k.starts_with(runtime.as_str()) => Some(k),
        (Some(runtime), _) => Some(runtime.clone()),
        (None, k) => k,
    }
}

pub(super) fn waiting(reason: Option<&str>, message: Option<String>) -> ContainerState {
    ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: reason.map(str::to_string),
            message,
        }),
        ..Default::default()
    }
}
