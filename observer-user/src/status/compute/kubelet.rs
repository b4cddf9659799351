//! kubelet's status functions, one for one, on the API types (Kubernetes 1.37: getPhase,
//! `convertToAPIContainerStatuses`, `status.Generate*Condition`, `PodSandboxChanged`,
//! `ShouldContainerBeRestarted`, `ShouldAllContainersRestart`, and podutil's
//! `ContainerShouldRestart`, `FindMatchingContainerRestartRule`, `AllContainersCouldRestart`,
//! `Calculate*ObservedGeneration`). Inputs kubelet takes from its own state (the pod worker's
//! `podIsTerminal`, the prober, the reason cache, `podRestarting`) are parameters here, so that
//! kubelet's test cases run against them as they are written; `compute.rs` says where the
//! agent's values for them come from.
//!
//! Feature gates are 1.37's defaults: ContainerRestartRules (beta, 1.35),
//! RestartAllContainersOnContainerExits (beta, 1.36) and PodObservedGenerationTracking (GA,
//! 1.35) on. A 1.35 kubelet has RestartAllContainers off; it then declares no such node feature
//! and the scheduler (NodeDeclaredFeatures) places no pod that uses the action on its node.
use k8s_openapi::api::core::v1::{
    Container, ContainerRestartRule, ContainerState, ContainerStateRunning,
    ContainerStateTerminated, ContainerStateWaiting, ContainerStatus, Pod, PodCondition, PodSpec,
    PodStatus,
};

use super::{to_time, RestartPolicy, CONTAINER_CREATING, POD_INITIALIZING, STATUS_UNKNOWN};
use crate::reconcile::{ContainerPhase, ContainerView, PodView};
use crate::status::conditions::is_sidecar;

/// The reason kubelet (1.35+, RestartAllContainers) gives the containers it removed to restart
/// all of a pod's containers in place, waiting and in their last state.
pub(crate) const RESTARTING_ALL_CONTAINERS: &str = "RestartingAllContainers";
/// Their message (kubelet_pods.go).
pub(crate) const RESTARTING_ALL_CONTAINERS_MESSAGE: &str =
    "The container is removed because RestartAllContainers in place";
/// The restart rule action that restarts every container of the pod (KEP-5532).
pub(crate) const RESTART_ALL_CONTAINERS: &str = "RestartAllContainers";
/// kubelet's condition of a pod restarting all its containers in place (1.36+).
pub(crate) const ALL_CONTAINERS_RESTARTING: &str = "AllContainersRestarting";

/// kubelet's condition reasons (pkg/kubelet/status).
pub(crate) const UNKNOWN_CONTAINER_STATUSES: &str = "UnknownContainerStatuses";
pub(crate) const POD_COMPLETED: &str = "PodCompleted";
pub(crate) const POD_FAILED: &str = "PodFailed";
pub(crate) const CONTAINERS_NOT_READY: &str = "ContainersNotReady";
pub(crate) const CONTAINERS_NOT_INITIALIZED: &str = "ContainersNotInitialized";
pub(crate) const READINESS_GATES_NOT_READY: &str = "ReadinessGatesNotReady";
pub(crate) const RESTART_ALL_CONTAINERS_STARTED: &str = "RestartAllContainersStarted";
/// PodReadyToStartContainers' False (kubelet 1.37, pkg/kubelet/types): the reason, and why a
/// new sandbox is needed as its message.
pub(crate) const POD_SANDBOX_NOT_READY: &str = "PodSandboxNotReady";
pub(crate) const SANDBOX_MSG_NONE: &str = "no pod sandbox exists";
pub(crate) const SANDBOX_MSG_MULTIPLE: &str =
    "multiple pod sandboxes are ready and need to be reconciled";
pub(crate) const SANDBOX_MSG_NOT_READY: &str = "pod sandbox is not ready";
pub(crate) const SANDBOX_MSG_NAMESPACE: &str =
    "network namespace mode changed and sandbox needs to be recreated";
pub(crate) const SANDBOX_MSG_NO_IP: &str = "pod sandbox has no IP address";

fn state(s: &ContainerStatus) -> ContainerState {
    s.state.clone().unwrap_or_default()
}

fn last_terminated(s: &ContainerStatus) -> Option<&ContainerStateTerminated> {
    s.last_state.as_ref().and_then(|l| l.terminated.as_ref())
}

fn find<'s>(statuses: &'s [ContainerStatus], name: &str) -> Option<&'s ContainerStatus> {
    statuses.iter().find(|s| s.name == name)
}

fn terminated_state(t: ContainerStateTerminated) -> ContainerState {
    ContainerState {
        terminated: Some(t),
        ..Default::default()
    }
}

/// `podutil.CalculatePodConditionObservedGeneration` and `CalculatePodStatusObservedGeneration`
/// with PodObservedGenerationTracking on (GA and locked from 1.35): the pod's
/// `metadata.generation`. None where the API server sets none (before 1.33): Go's 0 is omitted.
pub(crate) fn observed_generation(pod: &Pod) -> Option<i64> {
    pod.metadata.generation.filter(|g| *g != 0)
}

/// `podutil.FindMatchingContainerRestartRule`: the first of the container's rules whose exit
/// codes match (`In` listed, `NotIn` not listed; a rule without exit codes or with another
/// operator never matches).
pub(crate) fn matching_rule(c: &Container, exit_code: i32) -> Option<&ContainerRestartRule> {
    c.restart_policy_rules.iter().flatten().find(|r| {
        r.exit_codes.as_ref().is_some_and(|e| {
            let listed = e.values.iter().flatten().any(|v| *v == exit_code);
            match e.operator.as_str() {
                "In" => listed,
                "NotIn" => !listed,
                _ => false,
            }
        })
    })
}

/// `podutil.ContainerShouldRestart`: whether kubelet runs container `c` again after an instance
/// of it ended with `exit_code`. Its own restart rules first (a `Restart` or
/// `RestartAllContainers` action restarts it; an action this release does not know falls through
/// to its policy), then its own restart policy, then the pod's (Always when unset). The one
/// answer every "will it restart" of the agent comes from: the phase, the waiting reason
/// between restarts, ContainersAlive.
pub(crate) fn container_should_restart(c: &Container, spec: &PodSpec, exit_code: i32) -> bool {
    if let Some(policy) = c.restart_policy.as_deref() {
        if let Some(rule) = matching_rule(c, exit_code) {
            if matches!(rule.action.as_str(), "Restart" | RESTART_ALL_CONTAINERS) {
                return true;
            }
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

/// getPhase's question of a terminated state: its container restarts by
/// [`container_should_restart`], or it was removed to restart all the pod's containers.
fn restartable(c: &Container, spec: &PodSpec, t: &ContainerStateTerminated) -> bool {
    container_should_restart(c, spec, t.exit_code)
        || t.reason.as_deref() == Some(RESTARTING_ALL_CONTAINERS)
}

/// `podutil.AllContainersCouldRestart`: a container or init container has a
/// `RestartAllContainers` rule.
pub(crate) fn all_containers_could_restart(spec: &PodSpec) -> bool {
    spec.init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .flat_map(|c| c.restart_policy_rules.iter().flatten())
        .any(|r| r.action == RESTART_ALL_CONTAINERS)
}

/// The runtime's instances of a container, newest first (kubelet's `podStatus.ContainerStatuses`
/// order: by creation time).
pub(crate) fn instances<'v>(view: &'v PodView, name: &str) -> Vec<&'v ContainerView> {
    let mut v: Vec<&ContainerView> = view.containers.iter().filter(|c| c.name == name).collect();
    v.sort_by_key(|c| std::cmp::Reverse((c.created_at, c.restart_count)));
    v
}

/// An exited instance's code where the exit is not known: what a killed container gives.
pub(crate) fn exit_code(v: &ContainerView) -> i32 {
    v.exit_code.unwrap_or(137)
}

/// `kubecontainer.ShouldAllContainersRestart`: the pod restarts all its containers in place
/// (kubelet's `podRestarting`): `old` (kubelet's last status) says AllContainersRestarting, or a
/// container's newest instance in the runtime, or its terminated state in `old`, ended with a
/// code a `RestartAllContainers` rule of it matches.
pub(crate) fn should_all_containers_restart(
    pod: &Pod,
    view: &PodView,
    old: Option<&PodStatus>,
) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    let conditions = old.and_then(|o| o.conditions.as_deref()).unwrap_or(&[]);
    if conditions
        .iter()
        .any(|c| c.type_ == ALL_CONTAINERS_RESTARTING && c.status == "True")
    {
        return true;
    }
    let restarts_all = |c: &Container, code: i32| {
        matching_rule(c, code).is_some_and(|r| r.action == RESTART_ALL_CONTAINERS)
    };
    // By name, a regular container's status over an init container's (kubelet's map).
    let api = |name: &str| {
        let lists = old.into_iter().flat_map(|o| {
            [&o.container_statuses, &o.init_container_statuses]
                .into_iter()
                .flatten()
        });
        lists.flatten().find(|s| s.name == name)
    };
    spec.init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .any(|c| {
            let runtime = instances(view, &c.name)
                .first()
                .filter(|v| v.phase == ContainerPhase::Exited)
                .is_some_and(|v| restarts_all(c, exit_code(v)));
            let kubelets = api(&c.name)
                .and_then(|s| s.state.as_ref()?.terminated.as_ref())
                .is_some_and(|t| restarts_all(c, t.exit_code));
            runtime || kubelets
        })
}

/// `kubecontainer.AllContainersRestartCleanedUp`: the runtime has no instance of any of the
/// pod's containers left.
pub(crate) fn all_containers_restart_cleaned_up(pod: &Pod, view: &PodView) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return true;
    };
    spec.init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .all(|c| instances(view, &c.name).is_empty())
}

/// `status.GenerateAllContainersRestartingCondition` (kubelet sets no observedGeneration on it).
pub(crate) fn all_containers_restarting_condition(
    pod: &Pod,
    view: &PodView,
    old: Option<&PodStatus>,
    phase: &str,
) -> PodCondition {
    let (ok, reason, message) = match phase {
        "Succeeded" => (false, Some(POD_COMPLETED), None),
        "Failed" => (false, Some(POD_FAILED), None),
        _ if !should_all_containers_restart(pod, view, old)
            || all_containers_restart_cleaned_up(pod, view) =>
        {
            (false, None, None)
        }
        _ => (
            true,
            Some(RESTART_ALL_CONTAINERS_STARTED),
            Some("container exited with restart policy rule".to_string()),
        ),
    };
    PodCondition {
        type_: ALL_CONTAINERS_RESTARTING.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: reason.map(str::to_string),
        message,
        ..Default::default()
    }
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

/// kubelet's `PodSandboxChanged`: why a new sandbox is needed (1.37's message for it), or
/// `None`. `sandboxes` newest first. What the view does not say (a sandbox's IP and namespace
/// mode) is never a reason.
pub(crate) fn pod_sandbox_changed(pod: &Pod, sandboxes: &[Sandbox]) -> Option<&'static str> {
    let Some(newest) = sandboxes.first() else {
        return Some(SANDBOX_MSG_NONE);
    };
    let host_network = pod
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false);
    if sandboxes.iter().filter(|s| s.ready).count() > 1 {
        Some(SANDBOX_MSG_MULTIPLE)
    } else if !newest.ready {
        Some(SANDBOX_MSG_NOT_READY)
    } else if newest.host_network.is_some_and(|h| h != host_network) {
        Some(SANDBOX_MSG_NAMESPACE)
    } else if !host_network && newest.ip.as_deref() == Some("") {
        Some(SANDBOX_MSG_NO_IP)
    } else {
        None
    }
}

/// A condition of kubelet's, with the pod's generation observed.
pub(super) fn condition(
    pod: &Pod,
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
        observed_generation: observed_generation(pod),
        ..Default::default()
    }
}

/// `status.GeneratePodReadyToStartContainersCondition` (1.37: a False one says why).
pub(crate) fn ready_to_start_containers_condition(
    pod: &Pod,
    sandboxes: &[Sandbox],
) -> PodCondition {
    match pod_sandbox_changed(pod, sandboxes) {
        None => condition(pod, "PodReadyToStartContainers", true, None, None),
        Some(why) => condition(
            pod,
            "PodReadyToStartContainers",
            false,
            Some(POD_SANDBOX_NOT_READY),
            Some(why.to_string()),
        ),
    }
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
            pod,
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
        return terminal_ready_condition(pod, "ContainersReady", phase);
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
        condition(pod, "ContainersReady", true, None, None)
    } else {
        condition(
            pod,
            "ContainersReady",
            false,
            Some(CONTAINERS_NOT_READY),
            Some(msgs.join(", ")),
        )
    }
}

/// `generate{ContainersReady,PodReady}ConditionForTerminalPhase`.
pub(crate) fn terminal_ready_condition(pod: &Pod, type_: &str, phase: &str) -> PodCondition {
    let reason = match phase {
        "Failed" => Some(POD_FAILED),
        "Succeeded" => Some(POD_COMPLETED),
        _ => None,
    };
    condition(pod, type_, false, reason, None)
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
        condition(pod, "Ready", true, None, None)
    } else {
        condition(
            pod,
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
/// sidecar when started; a regular container that ran means the pod was initialized; and a pod
/// `old` (kubelet's last status) says was initialized stays so while its init containers run
/// again in an in-place restart of all its containers.
pub(crate) fn initialized_condition(
    pod: &Pod,
    old: &PodStatus,
    statuses: Option<&[ContainerStatus]>,
    phase: &str,
) -> PodCondition {
    let empty = PodSpec::default();
    let spec = pod.spec.as_ref().unwrap_or(&empty);
    let init_specs = spec.init_containers.as_deref().unwrap_or(&[]);
    let statuses = match statuses {
        Some(s) => s,
        None if !init_specs.is_empty() => {
            return condition(
                pod,
                "Initialized",
                false,
                Some(UNKNOWN_CONTAINER_STATUSES),
                None,
            )
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
        return condition(pod, "Initialized", true, Some(POD_COMPLETED), None);
    }
    if has_any_regular_container_started(spec, statuses) {
        return condition(pod, "Initialized", true, None, None);
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
        return condition(pod, "Initialized", true, None, None);
    }
    let was_initialized = old
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Initialized" && c.status == "True");
    if was_initialized {
        return condition(pod, "Initialized", true, None, None);
    }
    condition(
        pod,
        "Initialized",
        false,
        Some(CONTAINERS_NOT_INITIALIZED),
        Some(msgs.join(", ")),
    )
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
    /// kubelet's `podRestarting`: the pod restarts all its containers in place
    /// ([`should_all_containers_restart`]).
    pub pod_restarting: bool,
}

impl Convert<'_> {
    fn deleting(&self) -> bool {
        self.pod.metadata.deletion_timestamp.is_some()
    }

    /// The runtime's instances of a container, newest first (kubelet sorts by creation time).
    pub(super) fn instances(&self, name: &str) -> Vec<&ContainerView> {
        instances(self.view, name)
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

    /// `kubecontainer.ShouldContainerBeRestarted`: never for a deleted pod; a container never
    /// created (or all of whose instances the runtime removed), unknown or only created is
    /// started; an exited one as [`container_should_restart`] says for its newest exit.
    pub(super) fn should_be_restarted(&self, c: &Container) -> bool {
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
                container_should_restart(c, spec, exit_code(cur))
            }
        }
    }

    /// kubelet's `convertContainerStatus`: one runtime instance, with the old status of its
    /// container (by name).
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
        if let Some(o) = old {
            // RestartAllContainers (on from 1.36) removes the old instances: the restart count
            // never goes down, and the termination before a new instance is the old status's.
            s.restart_count = s.restart_count.max(o.restart_count);
            match (state(o).terminated, last_terminated(o)) {
                (Some(t), _) if o.container_id.as_deref() != Some(id.as_str()) => {
                    s.last_state = Some(terminated_state(t));
                }
                (_, Some(t)) => s.last_state = Some(terminated_state(t.clone())),
                _ => {}
            }
        }
        s.state = Some(match v.phase {
            ContainerPhase::Running => {
                // Running again after a termination the runtime no longer has.
                if let Some(o) = old.filter(|o| {
                    state(o).terminated.is_some() && o.restart_count >= v.restart_count as i32
                }) {
                    s.restart_count = o.restart_count + 1;
                }
                ContainerState {
                    running: Some(ContainerStateRunning {
                        started_at: v.started_at.map(to_time),
                    }),
                    ..Default::default()
                }
            }
            ContainerPhase::Created => waiting(None, None),
            ContainerPhase::Exited => terminated_state(ContainerStateTerminated {
                exit_code: exit_code(v),
                signal: v.signal.map(i32::from),
                reason: Some(super::terminated_reason(v)),
                message: message(v, old, &id),
                started_at: v.started_at.map(to_time),
                finished_at: v.finished_at.map(to_time),
                container_id: Some(id),
            }),
            ContainerPhase::Unknown => match old {
                Some(o) if state(o).running.is_some() => {
                    s.restart_count = o.restart_count + 1;
                    let reason = if self.pod_restarting {
                        RESTARTING_ALL_CONTAINERS
                    } else {
                        STATUS_UNKNOWN
                    };
                    terminated_state(ContainerStateTerminated {
                        reason: Some(reason.into()),
                        message: Some(
                            "The container could not be located when the pod was terminated".into(),
                        ),
                        exit_code: 137,
                        ..Default::default()
                    })
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
        // Containers the runtime has no instance of, that kubelet had seen.
        for s in statuses.iter_mut() {
            if !self.instances(&s.name).is_empty() {
                continue;
            }
            let Some(o) = find(previous, &s.name) else {
                continue;
            };
            let os = state(o);
            // Removed to restart all the pod's containers in place: waiting to run again.
            if self.pod_restarting && os.waiting.is_none() {
                s.state = Some(waiting(
                    Some(RESTARTING_ALL_CONTAINERS),
                    Some(RESTARTING_ALL_CONTAINERS_MESSAGE.into()),
                ));
                s.last_state = Some(terminated_state(ContainerStateTerminated {
                    reason: Some(RESTARTING_ALL_CONTAINERS.into()),
                    message: Some(RESTARTING_ALL_CONTAINERS_MESSAGE.into()),
                    exit_code: 137,
                    ..Default::default()
                }));
                s.restart_count = o.restart_count + 1;
                continue;
            }
            // Lost while kubelet had seen it running: it terminated, how is unknown, and
            // (unless the pod is being deleted) it was restarted.
            if os.terminated.is_some() || os.running.is_none() {
                continue;
            }
            let default = state(s)
                .waiting
                .is_some_and(|w| w.reason.as_deref() == Some(default_reason));
            if !default || last_terminated(s).is_some() {
                continue;
            }
            s.last_state = Some(terminated_state(ContainerStateTerminated {
                reason: Some(STATUS_UNKNOWN.into()),
                message: Some(
                    "The container could not be located when the pod was deleted.  The \
                     container used to be Running"
                        .into(),
                ),
                exit_code: 137,
                ..Default::default()
            }));
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
                    s.state = Some(terminated_state(ContainerStateTerminated {
                        reason: Some("Completed".into()),
                        message: Some(
                            "Unable to get init container status from container runtime \
                             and pod has been initialized, treat it as exited normally"
                                .into(),
                        ),
                        exit_code: 0,
                        ..Default::default()
                    }));
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
