//! The columns `kubectl get pods` prints for a pod (kubectl's `printPod`), read from the status
//! the agent computes: READY, STATUS and RESTARTS say what the computed status says, nothing
//! of their own.
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{ContainerStateTerminated, Pod, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::{
    reconcile::PodView,
    status::{
        compute::{compute_status, to_time, StatusInputs, Unknown},
        conditions::{is_sidecar, ConditionTypes},
    },
};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Columns {
    /// `ready/total`; `?/total` when a running container's readiness is not known.
    pub ready: String,
    pub status: String,
    pub restarts: u32,
    /// The latest termination among the counted restarts, for `RESTARTS`' "(5m ago)".
    pub last_restart: Option<SystemTime>,
}

/// kubectl's RESTARTS cell: `2 (5m30s ago)`.
pub(crate) fn restarts_cell(
    restarts: u32,
    last_restart: Option<SystemTime>,
    now: SystemTime,
) -> String {
    match last_restart {
        Some(at) if restarts > 0 => format!(
            "{restarts} ({} ago)",
            human_duration(now.duration_since(at).unwrap_or_default())
        ),
        _ => restarts.to_string(),
    }
}

/// kubectl's `printPod` on `pod` (its spec may be absent: then the containers are the
/// statuses'), whose status is the computed one; `unknown` is what the computation could not
/// know (a running container of unknown readiness counts as running, not as ready).
pub fn columns(pod: &Pod, unknown: &[Unknown]) -> Columns {
    let empty = PodStatus::default();
    let status = pod.status.as_ref().unwrap_or(&empty);
    let empty_spec = PodSpec::default();
    let spec = pod.spec.as_ref().unwrap_or(&empty_spec);
    let regular = status.container_statuses.as_deref().unwrap_or(&[]);
    let init = status.init_container_statuses.as_deref().unwrap_or(&[]);
    let init_specs = spec.init_containers.as_deref().unwrap_or(&[]);
    let sidecar = |name: &str| init_specs.iter().any(|c| c.name == name && is_sidecar(c));
    let readiness_unknown = |name: &str| unknown.contains(&Unknown::Readiness(name.to_string()));
    let mut total = match &pod.spec {
        Some(s) => s.containers.len(),
        None => regular.len(),
    };
    total += init_specs.iter().filter(|c| is_sidecar(c)).count();
    let mut ready = 0;
    let mut ready_unknown = false;
    let mut restarts = 0u32;
    let mut sidecar_restarts = 0u32;
    let mut last_restart: Option<SystemTime> = None;
    let mut last_sidecar_restart: Option<SystemTime> = None;
    let finished = |s: &k8s_openapi::api::core::v1::ContainerStatus| {
        s.last_state
            .as_ref()
            .and_then(|l| l.terminated.as_ref())
            .and_then(|t| t.finished_at.as_ref())
            .map(|t| SystemTime::from(t.0))
    };

    let mut reason = pod_reason(status);

    let mut initializing = false;
    for (i, c) in init.iter().enumerate() {
        let count = u32::try_from(c.restart_count).unwrap_or(0);
        restarts += count;
        last_restart = last_restart.max(finished(c));
        if sidecar(&c.name) {
            sidecar_restarts += count;
            last_sidecar_restart = last_sidecar_restart.max(finished(c));
        }
        let st = c.state.clone().unwrap_or_default();
        let term = st.terminated.as_ref();
        if term.is_some_and(|t| t.exit_code == 0) {
            continue;
        }
        if sidecar(&c.name) && c.started == Some(true) {
            if c.ready {
                ready += 1;
            }
            continue;
        }
        initializing = true;
        reason = match (term, st.waiting.as_ref()) {
            (Some(t), _) => terminated_reason(t, "Init:"),
            (None, Some(w))
                if w.reason
                    .as_deref()
                    .is_some_and(|r| !r.is_empty() && r != "PodInitializing") =>
            {
                format!("Init:{}", w.reason.as_deref().unwrap_or(""))
            }
            _ => format!("Init:{i}/{}", init_specs.len()),
        };
        break;
    }

    let initialized = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Initialized" && c.status == "True");
    if !initializing || initialized {
        restarts = sidecar_restarts;
        last_restart = last_sidecar_restart;
        let mut has_running = false;
        for c in regular.iter().rev() {
            restarts += u32::try_from(c.restart_count).unwrap_or(0);
            last_restart = last_restart.max(finished(c));
            let st = c.state.clone().unwrap_or_default();
            if let Some(r) = st
                .waiting
                .as_ref()
                .and_then(|w| w.reason.clone())
                .filter(|r| !r.is_empty())
            {
                reason = r;
            } else if let Some(t) = &st.terminated {
                reason = terminated_reason(t, "");
            } else if st.running.is_some() && (c.ready || readiness_unknown(&c.name)) {
                has_running = true;
                if c.ready {
                    ready += 1;
                } else {
                    ready_unknown = true;
                }
            }
        }
        if reason == "Completed" && has_running {
            let ready_condition = status
                .conditions
                .iter()
                .flatten()
                .find(|c| c.type_ == "Ready");
            // Without a Ready condition (no spec: readiness unknown) the phase stands.
            reason = match ready_condition {
                Some(c) if c.status != "True" => "NotReady".into(),
                _ => "Running".into(),
            };
        }
    }

    let terminal = matches!(status.phase.as_deref(), Some("Succeeded" | "Failed"));
    if pod.metadata.deletion_timestamp.is_some() {
        if status.reason.as_deref() == Some("NodeLost") {
            reason = "Unknown".into();
        } else if !terminal {
            reason = "Terminating".into();
        }
    }
    Columns {
        ready: if ready_unknown {
            format!("?/{total}")
        } else {
            format!("{ready}/{total}")
        },
        status: reason,
        restarts,
        last_restart,
    }
}

/// The pod's own reason, or its phase; a pod held by a scheduling gate says so.
fn pod_reason(status: &PodStatus) -> String {
    let gated = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "PodScheduled" && c.reason.as_deref() == Some("SchedulingGated"));
    if gated {
        return "SchedulingGated".into();
    }
    status
        .reason
        .clone()
        .filter(|r| !r.is_empty())
        .or_else(|| status.phase.clone())
        .unwrap_or_default()
}

/// kubectl's words for a terminated container: its reason, else its signal, else its code.
fn terminated_reason(t: &ContainerStateTerminated, prefix: &str) -> String {
    match t.reason.as_deref().filter(|r| !r.is_empty()) {
        Some(r) => format!("{prefix}{r}"),
        None if t.signal.unwrap_or(0) != 0 => format!("{prefix}Signal:{}", t.signal.unwrap_or(0)),
        None => format!("{prefix}ExitCode:{}", t.exit_code),
    }
}

/// The columns of a pod from the node's view alone (no API: no spec), as `observer status`
/// prints them: the status is computed, then printed.
pub(crate) fn view_columns(view: &PodView, now: SystemTime) -> Columns {
    let (pod, unknown) = computed_pod(view, None, &ConditionTypes::default(), "", now);
    columns(&pod, &unknown)
}

/// A pod the API binds to this node that the runtime has no sandbox for: kubelet has not made
/// one yet, or cannot (no network plugin, a pause image it cannot pull). What is known of it is
/// the API's; the runtime's part is empty, so its status is computed as kubelet computes one for
/// a pod with no sandbox (containers `ContainerCreating`, `PodReadyToStartContainers` False). The
/// status manager never sees such a view (the reconciler publishes only the runtime's pods), so
/// `full` mode never writes it. `None` for a pod without a UID or a terminal one (a finished pod
/// whose sandbox kubelet removed is not waiting for one).
pub(crate) fn without_sandbox(pod: &Pod) -> Option<PodView> {
    let uid = crate::model::PodUid::parse(pod.metadata.uid.as_deref()?)?;
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded" | "Failed")) {
        return None;
    }
    Some(PodView {
        uid,
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        name: pod.metadata.name.clone().unwrap_or_default(),
        sandbox_id: crate::model::ContainerId::NONE,
        sandbox_ready: false,
        created_at: None,
        containers: Vec::new(),
        last_oom: None,
    })
}

/// The pod as far as the runtime knows it, with the status the agent computes without the API
/// (the spec unknown), and what that leaves unknown.
pub(crate) fn computed_pod(
    view: &PodView,
    api: Option<&Pod>,
    types: &ConditionTypes,
    runtime: &str,
    now: SystemTime,
) -> (Pod, Vec<Unknown>) {
    let computed = compute_status(&StatusInputs {
        pod: api,
        view,
        previous: None,
        now,
        runtime,
        types,
    });
    let pod = Pod {
        // kubectl leaves managedFields out of its output; so does this.
        metadata: api
            .map(|p| ObjectMeta {
                managed_fields: None,
                ..p.metadata.clone()
            })
            .unwrap_or_else(|| ObjectMeta {
                name: Some(view.name.clone()),
                namespace: Some(view.namespace.clone()),
                uid: Some(view.uid.to_string()),
                creation_timestamp: view.created_at.map(to_time),
                ..Default::default()
            }),
        spec: api.and_then(|p| p.spec.clone()),
        status: Some(computed.status),
    };
    (pod, computed.unknown)
}

/// kubectl's `duration.HumanDuration` (AGE, and RESTARTS' "ago").
pub(crate) fn human_duration(d: Duration) -> String {
    let s = d.as_secs();
    let (m, h) = (s / 60, s / 3600);
    let with = |a: u64, ua: &str, b: u64, ub: &str| {
        if b == 0 {
            format!("{a}{ua}")
        } else {
            format!("{a}{ua}{b}{ub}")
        }
    };
    match s {
        _ if s < 120 => format!("{s}s"),
        _ if m < 10 => with(m, "m", s % 60, "s"),
        _ if m < 180 => format!("{m}m"),
        _ if h < 8 => with(h, "h", m % 60, "m"),
        _ if h < 48 => format!("{h}h"),
        _ if h < 24 * 8 => with(h / 24, "d", h % 24, "h"),
        _ if h < 24 * 365 * 2 => format!("{}d", h / 24),
        _ if h < 24 * 365 * 8 => with(h / 24 / 365, "y", (h / 24) % 365, "d"),
        _ => format!("{}y", h / 24 / 365),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
        ContainerStatus, PodCondition,
    };

    use super::*;
    use crate::kube::testkit::{container, pod, sidecar, spec, t};
    use crate::status::compute::to_time;

    fn st(name: &str, state: ContainerState, ready: bool, restarts: i32) -> ContainerStatus {
        ContainerStatus {
            name: name.into(),
            state: Some(state),
            ready,
            restart_count: restarts,
            ..Default::default()
        }
    }
    fn running() -> ContainerState {
        ContainerState {
            running: Some(ContainerStateRunning::default()),
            ..Default::default()
        }
    }
    fn waiting(reason: &str) -> ContainerState {
        ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(reason.into()),
                message: None,
            }),
            ..Default::default()
        }
    }
    fn terminated(reason: &str, code: i32, signal: Option<i32>) -> ContainerState {
        ContainerState {
            terminated: Some(ContainerStateTerminated {
                reason: (!reason.is_empty()).then(|| reason.into()),
                exit_code: code,
                signal,
                ..Default::default()
            }),
            ..Default::default()
        }
    }
    fn status(phase: &str, init: Vec<ContainerStatus>, regular: Vec<ContainerStatus>) -> PodStatus {
        PodStatus {
            phase: Some(phase.into()),
            init_container_statuses: (!init.is_empty()).then_some(init),
            container_statuses: Some(regular),
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: "False".into(),
                ..Default::default()
            }]),
            ..Default::default()
        }
    }

    #[test]
    fn kubectls_status_column() {
        let two = || spec("Always", vec![], vec![container("a"), container("b")]);
        let with_init = || spec("Always", vec![container("setup")], vec![container("a")]);
        let cases: Vec<(&str, Pod, &str, &str)> = vec![
            (
                "a waiting reason wins over the phase",
                pod(
                    two(),
                    Some(status(
                        "Running",
                        vec![],
                        vec![
                            st("a", running(), true, 0),
                            st("b", waiting("CrashLoopBackOff"), false, 3),
                        ],
                    )),
                ),
                "CrashLoopBackOff",
                "1/2",
            ),
            (
                "a terminated reason; without one the signal, else the exit code",
                pod(
                    two(),
                    Some(status(
                        "Running",
                        vec![],
                        vec![
                            st("a", terminated("", 0, Some(9)), false, 0),
                            st("b", terminated("", 3, None), false, 0),
                        ],
                    )),
                ),
                // kubectl walks the containers backwards: the first one decides.
                "Signal:9",
                "0/2",
            ),
            (
                "an init container waiting with a reason",
                pod(
                    with_init(),
                    Some(status(
                        "Pending",
                        vec![st("setup", waiting("ImagePullBackOff"), false, 0)],
                        vec![st("a", waiting("PodInitializing"), false, 0)],
                    )),
                ),
                "Init:ImagePullBackOff",
                "0/1",
            ),
            (
                "an init container running: its index",
                pod(
                    with_init(),
                    Some(status(
                        "Pending",
                        vec![st("setup", running(), false, 0)],
                        vec![st("a", waiting("PodInitializing"), false, 0)],
                    )),
                ),
                "Init:0/1",
                "0/1",
            ),
            (
                "a failed init container",
                pod(
                    with_init(),
                    Some(status(
                        "Failed",
                        vec![st("setup", terminated("Error", 2, None), false, 0)],
                        vec![st("a", waiting("PodInitializing"), false, 0)],
                    )),
                ),
                "Init:Error",
                "0/1",
            ),
            (
                "completed next to a running container, not Ready",
                pod(
                    two(),
                    Some(status(
                        "Running",
                        vec![],
                        vec![
                            st("a", terminated("Completed", 0, None), false, 0),
                            st("b", running(), true, 0),
                        ],
                    )),
                ),
                "NotReady",
                "1/2",
            ),
            (
                "a started sidecar counts in READY",
                pod(
                    spec("Always", vec![sidecar("proxy")], vec![container("a")]),
                    Some(status(
                        "Running",
                        vec![ContainerStatus {
                            started: Some(true),
                            ..st("proxy", running(), true, 1)
                        }],
                        vec![st("a", running(), true, 0)],
                    )),
                ),
                "Running",
                "2/2",
            ),
        ];
        for (name, p, want, ready) in cases {
            let c = columns(&p, &[]);
            assert_eq!(
                (c.status.as_str(), c.ready.as_str()),
                (want, ready),
                "{name}"
            );
        }
    }

    #[test]
    fn terminating_and_restarts_with_their_age() {
        let mut p = pod(
            spec("Always", vec![], vec![container("a")]),
            Some(status(
                "Running",
                vec![],
                vec![ContainerStatus {
                    last_state: Some(ContainerState {
                        terminated: Some(ContainerStateTerminated {
                            finished_at: Some(to_time(t(100))),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..st("a", running(), true, 2)
                }],
            )),
        );
        let c = columns(&p, &[]);
        assert_eq!((c.status.as_str(), c.restarts), ("Running", 2));
        assert_eq!(
            restarts_cell(c.restarts, c.last_restart, t(100 + 330)),
            "2 (5m30s ago)"
        );
        p.metadata.deletion_timestamp = Some(to_time(t(200)));
        assert_eq!(columns(&p, &[]).status, "Terminating");
    }

    #[test]
    fn unknown_readiness_is_said_in_ready() {
        let mut p = pod(spec("Always", vec![], vec![container("a")]), None);
        p.spec = None;
        p.status = Some(PodStatus {
            phase: Some("Running".into()),
            container_statuses: Some(vec![st("a", running(), false, 0)]),
            ..Default::default()
        });
        let c = columns(&p, &[Unknown::Readiness("a".into())]);
        assert_eq!((c.ready.as_str(), c.status.as_str()), ("?/1", "Running"));
        assert_eq!(columns(&p, &[]).ready, "0/1");
    }

    #[test]
    fn human_durations_are_kubectls() {
        let d = |s| human_duration(Duration::from_secs(s));
        assert_eq!(
            [
                d(5),
                d(119),
                d(150),
                d(600),
                d(3 * 3600),
                d(5 * 3600 + 120),
                d(30 * 3600)
            ],
            ["5s", "119s", "2m30s", "10m", "3h", "5h2m", "30h"]
        );
        assert_eq!([d(3 * 86_400), d(86_400 * 9 + 3600)], ["3d", "9d"]);
        assert_eq!(d(4 * 86_400 + 5 * 3600), "4d5h");
    }

    /// A pod the API binds to the node with no sandbox in the runtime: listed with kubelet's
    /// status for a pod with no sandbox; a finished one is not waiting for a sandbox.
    #[test]
    fn a_pod_without_a_sandbox_is_computed_from_the_api() {
        let mut p = pod(spec("Always", vec![], vec![container("app")]), None);
        p.metadata.uid = Some("0f2d6a1e-4b8c-4a3e-9f1d-2c3b4a5d6e7f".into());
        p.metadata.namespace = Some("shop".into());
        p.metadata.name = Some("web".into());
        let v = without_sandbox(&p).expect("a view");
        assert_eq!((v.namespace.as_str(), v.name.as_str()), ("shop", "web"));
        assert!(v.containers.is_empty() && !v.sandbox_ready);
        assert_eq!(v.sandbox_id, crate::model::ContainerId::NONE);
        let (computed, _) = computed_pod(
            &v,
            Some(&p),
            &ConditionTypes::default(),
            "containerd",
            t(10),
        );
        let status = computed.status.unwrap();
        assert_eq!(status.phase.as_deref(), Some("Pending"));
        let app = &status.container_statuses.unwrap()[0];
        assert_eq!(
            app.state
                .as_ref()
                .unwrap()
                .waiting
                .as_ref()
                .unwrap()
                .reason
                .as_deref(),
            Some("ContainerCreating")
        );
        let ready_to_start = status
            .conditions
            .unwrap()
            .into_iter()
            .find(|c| c.type_ == "PodReadyToStartContainers")
            .unwrap();
        assert_eq!(ready_to_start.status, "False");

        p.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Succeeded".into()),
            ..Default::default()
        });
        assert!(without_sandbox(&p).is_none());
        p.metadata.uid = None;
        p.status = None;
        assert!(without_sandbox(&p).is_none());
    }
}
