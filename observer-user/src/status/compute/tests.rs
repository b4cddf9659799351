//! Table-driven: each case is named after the kubelet behaviour it pins.
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStatus, Pod, PodCondition, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::*;
use crate::kube::testkit::*;
use crate::reconcile::ContainerPhase::{Created, Running, Unknown as Lost};

/// What a case expects. Containers: (name, state, restart count, lastState), states written
/// `running`, `waiting:<reason>`, `terminated:<reason>:<code>`, `-` for none.
#[derive(Default)]
struct Expect {
    phase: Option<&'static str>,
    containers: &'static [(&'static str, &'static str, i32, &'static str)],
    init: &'static [(&'static str, &'static str, i32, &'static str)],
    /// (name, ready, started)
    ready: &'static [(&'static str, bool, Option<bool>)],
    /// (type, status, reason or "")
    conditions: &'static [(&'static str, &'static str, &'static str)],
    unknown: Vec<Unknown>,
    /// Checked last, for what the fields above cannot say.
    extra: Option<fn(&ComputedStatus)>,
}

struct Case {
    name: &'static str,
    pod: Option<Pod>,
    previous: Option<PodStatus>,
    view: crate::reconcile::PodView,
    now: SystemTime,
    expect: Expect,
}

fn describe(st: Option<&ContainerState>) -> String {
    let Some(st) = st else { return "-".into() };
    if st.running.is_some() {
        "running".into()
    } else if let Some(w) = &st.waiting {
        format!("waiting:{}", w.reason.as_deref().unwrap_or(""))
    } else if let Some(t) = &st.terminated {
        format!(
            "terminated:{}:{}",
            t.reason.as_deref().unwrap_or(""),
            t.exit_code
        )
    } else {
        "-".into()
    }
}

fn check_list(case: &str, list: Option<&Vec<ContainerStatus>>, want: &[(&str, &str, i32, &str)]) {
    if want.is_empty() {
        return;
    }
    let list = list.unwrap_or_else(|| panic!("{case}: no statuses"));
    let got: Vec<(String, String, i32, String)> = list
        .iter()
        .map(|s| {
            (
                s.name.clone(),
                describe(s.state.as_ref()),
                s.restart_count,
                describe(s.last_state.as_ref()),
            )
        })
        .collect();
    let want: Vec<(String, String, i32, String)> = want
        .iter()
        .map(|(n, s, r, l)| (n.to_string(), s.to_string(), *r, l.to_string()))
        .collect();
    assert_eq!(got, want, "{case}: container statuses");
}

fn cond<'a>(s: &'a PodStatus, t: &str) -> Option<&'a PodCondition> {
    s.conditions.iter().flatten().find(|c| c.type_ == t)
}

fn run(case: Case) {
    let types = ConditionTypes::default();
    let out = compute_status(&StatusInputs {
        pod: case.pod.as_ref(),
        view: &case.view,
        previous: case.previous.as_ref(),
        now: case.now,
        runtime: "containerd",
        types: &types,
    });
    let name = case.name;
    let e = &case.expect;
    if let Some(p) = e.phase {
        assert_eq!(
            out.status.phase.as_deref().unwrap_or("-"),
            p,
            "{name}: phase"
        );
    }
    check_list(name, out.status.container_statuses.as_ref(), e.containers);
    check_list(name, out.status.init_container_statuses.as_ref(), e.init);
    for (c, ready, started) in e.ready {
        let s = out
            .status
            .container_statuses
            .iter()
            .chain(out.status.init_container_statuses.iter())
            .flatten()
            .find(|s| s.name == *c)
            .unwrap_or_else(|| panic!("{name}: no status for {c}"));
        assert_eq!(
            (s.ready, s.started),
            (*ready, *started),
            "{name}: {c} ready/started"
        );
    }
    for (t, status, reason) in e.conditions {
        let c = cond(&out.status, t).unwrap_or_else(|| panic!("{name}: no condition {t}"));
        assert_eq!(c.status, *status, "{name}: {t} status ({c:?})");
        assert_eq!(
            c.reason.as_deref().unwrap_or(""),
            *reason,
            "{name}: {t} reason ({c:?})"
        );
    }
    for u in &e.unknown {
        assert!(
            out.unknown.contains(u),
            "{name}: {u:?} not said in {:?}",
            out.unknown
        );
    }
    if let Some(f) = e.extra {
        f(&out);
    }
}

fn always(containers: &[&str]) -> Pod {
    pod(
        spec(
            "Always",
            vec![],
            containers.iter().map(|n| container(n)).collect(),
        ),
        None,
    )
}

fn policy(p: &str, containers: &[&str]) -> Pod {
    pod(
        spec(p, vec![], containers.iter().map(|n| container(n)).collect()),
        None,
    )
}

fn with_init(
    p: &str,
    init: Vec<k8s_openapi::api::core::v1::Container>,
    containers: &[&str],
) -> Pod {
    pod(
        spec(p, init, containers.iter().map(|n| container(n)).collect()),
        None,
    )
}

fn running_status(name: &str, id: &str, ready: bool, started: bool) -> ContainerStatus {
    ContainerStatus {
        name: name.into(),
        container_id: Some(format!("containerd://{id}")),
        image_id: "sha256:feed".into(),
        ready,
        started: Some(started),
        state: Some(ContainerState {
            running: Some(ContainerStateRunning {
                started_at: Some(to_time(t(1))),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn api_status(
    phase: &str,
    statuses: Vec<ContainerStatus>,
    conditions: Vec<PodCondition>,
) -> PodStatus {
    PodStatus {
        phase: Some(phase.into()),
        container_statuses: Some(statuses),
        conditions: Some(conditions),
        start_time: Some(to_time(t(0))),
        ..Default::default()
    }
}

fn pod_with(mut p: Pod, status: PodStatus) -> Pod {
    p.status = Some(status);
    p
}

fn oomed(
    mut c: crate::reconcile::ContainerView,
    pid: u32,
    init: bool,
) -> crate::reconcile::ContainerView {
    c.last_oom = Some(oom(&c, pid, if init { "app" } else { "hog" }, init));
    c.oom_kills = 1;
    c
}

/// A container with its own restart policy.
fn own_policy(name: &str, policy: &str) -> k8s_openapi::api::core::v1::Container {
    let mut c = container(name);
    c.restart_policy = Some(policy.into());
    c
}

/// A container with its own restart policy and one rule: `action` on exit code `code`.
fn ruled(
    name: &str,
    policy: &str,
    action: &str,
    code: i32,
) -> k8s_openapi::api::core::v1::Container {
    let mut c = own_policy(name, policy);
    c.restart_policy_rules = Some(vec![ContainerRestartRule {
        action: action.into(),
        exit_codes: Some(ContainerRestartRuleOnExitCodes {
            operator: "In".into(),
            values: Some(vec![code]),
        }),
    }]);
    c
}

/// An init container `setup`, a `job` and a `trigger` that restarts every container on 42.
fn restart_all_pod() -> Pod {
    pod(
        spec(
            "Never",
            vec![container("setup")],
            vec![
                container("job"),
                ruled("trigger", "Never", "RestartAllContainers", 42),
            ],
        ),
        None,
    )
}

const RAC_WAITING: &str = "waiting:RestartingAllContainers";
const RAC_LAST_STATE: &str = "terminated:RestartingAllContainers:137";

/// An instance whose start failed, as containerd reports it.
fn never_started(restart: u32) -> crate::reconcile::ContainerView {
    let mut c = exited("app", restart, 128, "StartError");
    c.started_at = Some(std::time::UNIX_EPOCH);
    c
}

/// A container status waiting for `reason`, as kubelet wrote it.
fn waiting_for(name: &str, reason: &str) -> ContainerStatus {
    ContainerStatus {
        name: name.into(),
        state: Some(super::kubelet::waiting(
            Some(reason),
            Some(format!("kubelet's words for {reason}")),
        )),
        ..Default::default()
    }
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "running_container_without_probes_is_started_and_ready",
            pod: Some(always(&["app"])),
            previous: None,
            view: view(vec![cv("app", 0, Running)]),
            now: t(100),
            expect: Expect {
                phase: Some("Running"),
                containers: &[("app", "running", 0, "-")],
                ready: &[("app", true, Some(true))],
                conditions: &[
                    ("Ready", "True", ""),
                    ("ContainersReady", "True", ""),
                    ("Initialized", "True", ""),
                    ("PodScheduled", "True", ""),
                    ("PodReadyToStartContainers", "True", ""),
                ],
                ..Default::default()
            },
        },
        Case {
            name: "created_not_started_is_waiting_without_reason_and_pending",
            pod: Some(always(&["app"])),
            previous: None,
            view: view(vec![cv("app", 0, Created)]),
            now: t(100),
            expect: Expect {
                phase: Some("Pending"),
                containers: &[("app", "waiting:", 0, "-")],
                ready: &[("app", false, Some(false))],
                conditions: &[("ContainersReady", "False", "ContainersNotReady")],
                ..Default::default()
            },
        },
        Case {
            name: "container_the_runtime_has_not_created_is_container_creating",
            pod: Some(always(&["app", "side"])),
            previous: None,
            view: view(vec![cv("app", 0, Running)]),
            now: t(100),
            expect: Expect {
                phase: Some("Pending"),
                containers: &[
                    ("app", "running", 0, "-"),
                    ("side", "waiting:ContainerCreating", 0, "-"),
                ],
                ..Default::default()
            },
        },
        // An image that cannot be had: only kubelet knows; its reason and message are kept.
        Case {
            name: "a_container_waiting_for_its_image_keeps_kubelets_reason",
            pod: Some(pod_with(
                always(&["app", "side"]),
                api_status(
                    "Pending",
                    vec![
                        running_status("app", "a1", true, true),
                        ContainerStatus {
                            name: "side".into(),
                            state: Some(super::kubelet::waiting(
                                Some("ErrImageNeverPull"),
                                Some("Container image \"x:1\" is not present with pull policy of Never".into()),
                            )),
                            ..Default::default()
                        },
                    ],
                    vec![],
                ),
            )),
            previous: None,
            view: view(vec![cv("app", 0, Running)]),
            now: t(100),
            expect: Expect {
                phase: Some("Pending"),
                containers: &[
                    ("app", "running", 0, "-"),
                    ("side", "waiting:ErrImageNeverPull", 0, "-"),
                ],
                unknown: vec![Unknown::KubeletReason("side".into())],
                extra: Some(|out| {
                    let side = out.status.container_statuses.as_ref().unwrap()
                        .iter().find(|s| s.name == "side").unwrap();
                    let w = side.state.as_ref().unwrap().waiting.as_ref().unwrap();
                    assert_eq!(
                        w.message.as_deref(),
                        Some("Container image \"x:1\" is not present with pull policy of Never")
                    );
                }),
                ..Default::default()
            },
        },
        // The reasons that are the agent's to say are not taken from the API.
        Case {
            name: "a_reason_the_agent_computes_is_not_taken_from_the_api",
            pod: Some(pod_with(
                always(&["app", "side"]),
                api_status(
                    "Pending",
                    vec![
                        running_status("app", "a1", true, true),
                        ContainerStatus {
                            name: "side".into(),
                            state: Some(super::kubelet::waiting(Some("CrashLoopBackOff"), None)),
                            ..Default::default()
                        },
                    ],
                    vec![],
                ),
            )),
            previous: None,
            view: view(vec![cv("app", 0, Running)]),
            now: t(100),
            expect: Expect {
                phase: Some("Pending"),
                containers: &[
                    ("app", "running", 0, "-"),
                    ("side", "waiting:ContainerCreating", 0, "-"),
                ],
                ..Default::default()
            },
        },
        Case {
            name: "with_init_containers_regular_ones_wait_in_pod_initializing",
            pod: Some(with_init("Always", vec![container("setup")], &["app"])),
            previous: None,
            view: view(vec![cv("setup", 0, Running)]),
            now: t(100),
            expect: Expect {
                phase: Some("Pending"),
                containers: &[("app", "waiting:PodInitializing", 0, "-")],
                init: &[("setup", "running", 0, "-")],
                conditions: &[("Initialized", "False", "ContainersNotInitialized")],
                ..Default::default()
            },
        },
        Case {
            name: "completed_init_container_is_ready_and_the_pod_initialized",
            pod: Some(with_init("Always", vec![container("setup")], &["app"])),
            previous: None,
            view: view(vec![
                exited("setup", 0, 0, "Completed"),
                cv("app", 0, Running),
            ]),
            now: t(100),
            expect: Expect {
                phase: Some("Running"),
                init: &[("setup", "terminated:Completed:0", 0, "-")],
                ready: &[("setup", true, Some(false)), ("app", true, Some(true))],
                conditions: &[("Initialized", "True", ""), ("Ready", "True", "")],
                ..Default::default()
            },
        },
        Case {
            name: "failed_init_container_under_never_fails_the_pod",
            pod: Some(with_init("Never", vec![container("setup")], &["app"])),
            previous: None,
            view: view(vec![exited("setup", 0, 3, "Error")]),
            now: t(100),
            expect: Expect {
                phase: Some("Failed"),
                init: &[("setup", "terminated:Error:3", 0, "-")],
                conditions: &[("Ready", "False", "PodFailed")],
                ..Default::default()
            },
        },
        Case {
            name: "failed_init_container_under_always_restarts_and_stays_pending",
            pod: Some(with_init("Always", vec![container("setup")], &["app"])),
            previous: None,
            view: view(vec![exited("setup", 0, 3, "Error")]),
            now: t(100),
            expect: Expect {
                phase: Some("Pending"),
                init: &[("setup", "terminated:Error:3", 0, "-")],
                containers: &[("app", "waiting:PodInitializing", 0, "-")],
                ..Default::default()
            },
        },
        Case {
            name: "init_container_forgotten_by_the_runtime_after_regular_ones_started_completed",
            pod: Some(with_init("Always", vec![container("setup")], &["app"])),
            previous: None,
            view: view(vec![cv("app", 0, Running)]),
            now: t(100),
            expect: Expect {
                phase: Some("Running"),
                init: &[("setup", "terminated:Completed:0", 0, "-")],
                ..Default::default()
            },
        },
        Case {
            name: "restart_always_with_every_container_stopped_is_still_running",
            pod: Some(always(&["app"])),
            previous: None,
            view: view(vec![exited("app", 0, 1, "Error")]),
            now: t(100),
            expect: Expect {
                phase: Some("Running"),
                containers: &[("app", "terminated:Error:1", 0, "-")],
                conditions: &[("ContainersReady", "False", "ContainersNotReady")],
                ..Default::default()
            },
        },
        Case {
            name: "on_failure_with_every_container_succeeded_is_succeeded",
            pod: Some(policy("OnFailure", &["job"])),
            previous: None,
            view: view(vec![exited("job", 0, 0, "Completed")]),
            now: t(100),
            expect: Expect {
                phase: Some("Succeeded"),
                containers: &[("job", "terminated:Completed:0", 0, "-")],
                conditions: &[
                    ("Ready", "False", "PodCompleted"),
                    ("ContainersReady", "False", "PodCompleted"),
                    ("Initialized", "True", "PodCompleted"),
                ],
                ..Default::default()
            },
        },
        Case {
            name: "on_failure_with_a_failure_is_running_while_it_restarts",
            pod: Some(policy("OnFailure", &["job"])),
            previous: None,
            view: view(vec![exited("job", 0, 2, "Error")]),
            now: t(100),
            expect: Expect {
                phase: Some("Running"),
                ..Default::default()
            },
        },
        Case {
            name: "never_with_a_failure_is_failed",
            pod: Some(policy("Never", &["a", "b"])),
            previous: None,
            view: view(vec![
                exited("a", 0, 0, "Completed"),
                exited("b", 0, 1, "Error"),
            ]),
            now: t(100),
            expect: Expect {
                phase: Some("Failed"),
                conditions: &[
                    ("Ready", "False", "PodFailed"),
                    ("ContainersReady", "False", "PodFailed"),
                ],
                ..Default::default()
            },
        },
        Case {
            name: "never_with_every_container_succeeded_is_succeeded",
            pod: Some(policy("Never", &["a"])),
            previous: None,
            view: view(vec![exited("a", 0, 0, "Completed")]),
            now: t(100),
            expect: Expect {
                phase: Some("Succeeded"),
                ..Default::default()
            },
        },
        Case {
            name: "a_terminal_phase_in_the_api_never_goes_back",
            pod: Some(pod_with(
                policy("Never", &["a"]),
                api_status("Succeeded", vec![], vec![]),
            )),
            previous: None,
            view: view(vec![cv("a", 0, Running)]),
            now: t(100),
            expect: Expect {
                phase: Some("Succeeded"),
                conditions: &[("Ready", "False", "PodCompleted")],
                ..Default::default()
            },
        },
        Case {
            // kubelet forces the API's terminal phase back even over another terminal one.
            name: "the_apis_succeeded_is_kept_over_a_computed_failed",
            pod: Some(pod_with(
                policy("Never", &["a"]),
                api_status("Succeeded", vec![], vec![]),
            )),
            previous: None,
            view: view(vec![exited("a", 0, 1, "Error")]),
            now: t(100),
            expect: Expect {
                phase: Some("Succeeded"),
                conditions: &[("Ready", "False", "PodCompleted")],
                ..Default::default()
            },
        },
        Case {
            name: "an_empty_previous_reason_falls_back_to_the_apis",
            pod: Some(pod_with(always(&["app"]), {
                let mut s = api_status("Running", vec![], vec![]);
                s.reason = Some("NodeAffinity".into());
                s.message = Some("from the API".into());
                s
            })),
            previous: Some(api_status("Running", vec![], vec![])),
            view: view(vec![cv("app", 0, Running)]),
            now: t(100),
            expect: Expect {
                phase: Some("Running"),
                extra: Some(|out| {
                    assert_eq!(out.status.reason.as_deref(), Some("NodeAffinity"));
                    assert_eq!(out.status.message.as_deref(), Some("from the API"));
                }),
                ..Default::default()
            },
        },
        Case {
            // DisruptionTarget is not kubelet's: kept from the API though the previous status
            // (the agent's) has none.
            name: "a_disruption_target_in_the_api_is_kept",
            pod: Some(pod_with(
                always(&["app"]),
                api_status(
                    "Running",
                    vec![],
                    vec![PodCondition {
                        type_: "DisruptionTarget".into(),
                        status: "True".into(),
                        reason: Some("EvictionByEvictionAPI".into()),
                        ..Default::default()
                    }],
                ),
            )),
            previous: Some(api_status("Running", vec![], vec![])),
            view: view(vec![cv("app", 0, Running)]),
            now: t(100),
            expect: Expect {
                conditions: &[("DisruptionTarget", "True", "EvictionByEvictionAPI")],
                ..Default::default()
            },
        },
        Case {
            name: "a_terminal_phase_the_agent_computed_never_goes_back",
            pod: Some(policy("Never", &["a"])),
            previous: Some(api_status("Failed", vec![], vec![])),
            view: view(vec![cv("a", 0, Running)]),
            now: t(100),
            expect: Expect {
                phase: Some("Failed"),
                ..Default::default()
            },
        },
        Case {
            name: "deleted_pod_whose_sandbox_is_stopped_is_terminal_even_under_always",
            pod: Some({
                let mut p = always(&["app"]);
                p.metadata.deletion_timestamp = Some(to_time(t(50)));
                p
            }),
            previous: None,
            view: {
                let mut v = view(vec![exited("app", 0, 0, "Completed")]);
                v.sandbox_ready = false;
                v
            },
            now: t(100),
            expect: Expect {
                phase: Some("Succeeded"),
                containers: &[("app", "terminated:Completed:0", 0, "-")],
                conditions: &[
                    ("Initialized", "True", "PodCompleted"),
                    ("Ready", "False", "PodCompleted"),
                    ("ContainersReady", "False", "PodCompleted"),
                ],
                unknown: vec![Unknown::Termination],
                ..Default::default()
            },
        },
        Case {
            // kubelet's podIsTerminal is its pod worker's, not the deletion's.
            name: "deleted_pod_still_in_its_sandbox_is_not_terminal_yet",
            pod: Some({
                let mut p = always(&["app"]);
                p.metadata.deletion_timestamp = Some(to_time(t(50)));
                p
            }),
            previous: None,
            view: view(vec![exited("app", 0, 1, "Error")]),
            now: t(100),
            expect: Expect {
                phase: Some("Running"),
                containers: &[("app", "terminated:Error:1", 0, "-")],
                ..Default::default()
            },
        },
        Case {
            name: "first_death_restarts_at_once_without_crash_loop_back_off",
            pod: Some(always(&["app"])),
            previous: None,
            view: view(vec![exited("app", 0, 1, "Error")]),
            now: t(6),
            expect: Expect {
                containers: &[("app", "terminated:Error:1", 0, "-")],
                phase: Some("Running"),
                ..Default::default()
            },
        },
        Case {
            name: "second_death_waits_10s_in_crash_loop_back_off_with_the_death_as_last_state",
            pod: Some(always(&["app"])),
            previous: None,
            view: view(vec![
                exited("app", 0, 1, "Error"),
                exited("app", 1, 1, "Error"),
            ]),
            // The second instance finished at t(15).
            now: t(20),
            expect: Expect {
                phase: Some("Running"),
                containers: &[("app", "waiting:CrashLoopBackOff", 1, "terminated:Error:1")],
                extra: Some(|out| {
                    let s = &out.status.container_statuses.as_ref().unwrap()[0];
                    let w = s.state.as_ref().unwrap().waiting.as_ref().unwrap();
                    assert_eq!(
                        w.message.as_deref(),
                        Some(
                            "back-off 10s restarting failed container=app \
                             pod=web_default(0b6a3f5e-0000-4000-8000-000000000001)"
                        )
                    );
                }),
                ..Default::default()
            },
        },
        Case {
            name: "back_off_doubles_and_caps_at_300s",
            pod: Some(always(&["app"])),
            previous: None,
            view: view(vec![
                exited("app", 9, 1, "Error"),
                exited("app", 10, 1, "Error"),
            ]),
            // Finished at t(105): 10 s << 9 would be 5120 s; kubelet caps at 300 s.
            now: t(105 + 299),
            expect: Expect {
                containers: &[("app", "waiting:CrashLoopBackOff", 10, "terminated:Error:1")],
                extra: Some(|out| {
                    let s = &out.status.container_statuses.as_ref().unwrap()[0];
                    let w = s.state.as_ref().unwrap().waiting.as_ref().unwrap();
                    // Go's duration text, as kubelet prints it.
                    assert!(w.message.as_deref().unwrap().starts_with("back-off 5m0s "));
                }),
                ..Default::default()
            },
        },
        Case {
            name: "after_the_back_off_the_death_itself_is_shown_until_the_restart",
            pod: Some(always(&["app"])),
            previous: None,
            view: view(vec![
                exited("app", 0, 1, "Error"),
                exited("app", 1, 1, "Error"),
            ]),
            now: t(15 + 11),
            expect: Expect {
                containers: &[("app", "terminated:Error:1", 1, "terminated:Error:1")],
                ..Default::default()
            },
        },
        Case {
            name: "a_container_that_ran_ten_minutes_starts_its_back_off_over",
            pod: Some(always(&["app"])),
            previous: None,
            view: view(vec![exited("app", 0, 1, "Error"), {
                let mut c = exited("app", 3, 1, "Error");
                c.finished_at = Some(t(31 + 601));
                c
            }]),
            now: t(31 + 602),
            expect: Expect {
                containers: &[("app", "terminated:Error:1", 3, "terminated:Error:1")],
                ..Default::default()
            },
        },
        // Between restarts under a container's own policy and rules (ContainerRestartRules):
        // kubelet's ShouldContainerBeRestarted decides who waits out a back-off.
        Case {
            name: "a_restart_rule_on_its_exit_code_waits_out_the_back_off",
            pod: Some(pod(
                spec("Never", vec![], vec![ruled("app", "Never", "Restart", 3)]),
                None,
            )),
            previous: None,
            view: view(vec![exited("app", 0, 3, "Error"), exited("app", 1, 3, "Error")]),
            now: t(20),
            expect: Expect {
                phase: Some("Running"),
                containers: &[("app", "waiting:CrashLoopBackOff", 1, "terminated:Error:3")],
                ..Default::default()
            },
        },
        Case {
            name: "an_exit_code_no_rule_matches_is_its_end",
            pod: Some(pod(
                spec("Never", vec![], vec![ruled("app", "Never", "Restart", 3)]),
                None,
            )),
            previous: None,
            view: view(vec![exited("app", 0, 3, "Error"), exited("app", 1, 4, "Error")]),
            now: t(20),
            expect: Expect {
                phase: Some("Failed"),
                containers: &[("app", "terminated:Error:4", 1, "terminated:Error:3")],
                ..Default::default()
            },
        },
        Case {
            name: "its_own_never_under_the_pods_always_is_its_end",
            pod: Some(pod(
                spec("Always", vec![], vec![own_policy("app", "Never")]),
                None,
            )),
            previous: None,
            view: view(vec![exited("app", 0, 1, "Error")]),
            now: t(20),
            expect: Expect {
                phase: Some("Failed"),
                containers: &[("app", "terminated:Error:1", 0, "-")],
                ..Default::default()
            },
        },
        Case {
            name: "its_own_always_under_the_pods_never_backs_off_after_a_success",
            pod: Some(pod(
                spec("Never", vec![], vec![own_policy("app", "Always")]),
                None,
            )),
            previous: None,
            view: view(vec![
                exited("app", 0, 0, "Completed"),
                exited("app", 1, 0, "Completed"),
            ]),
            now: t(20),
            expect: Expect {
                phase: Some("Running"),
                containers: &[(
                    "app",
                    "waiting:CrashLoopBackOff",
                    1,
                    "terminated:Completed:0",
                )],
                ..Default::default()
            },
        },
        // A start that failed (containerd: StartError, exit 128, started at 1970): kubelet's
        // back-off runs from when it created the instance, not from a start it never had.
        Case {
            name: "a_start_that_failed_backs_off_like_a_crash",
            pod: Some(always(&["app"])),
            previous: None,
            view: view(vec![never_started(0), never_started(1)]),
            now: t(20),
            expect: Expect {
                phase: Some("Running"),
                containers: &[(
                    "app",
                    "waiting:CrashLoopBackOff",
                    1,
                    "terminated:StartError:128",
                )],
                ..Default::default()
            },
        },
        Case {
            name: "a_back_off_starts_over_only_after_more_than_600s",
            pod: Some(always(&["app"])),
            previous: None,
            // Created at t(30), ended exactly 600 s later: kubelet's entry has not expired.
            view: view(vec![exited("app", 0, 1, "Error"), {
                let mut c = exited("app", 3, 1, "Error");
                c.finished_at = Some(t(30 + 600));
                c
            }]),
            now: t(30 + 601),
            expect: Expect {
                containers: &[("app", "waiting:CrashLoopBackOff", 3, "terminated:Error:1")],
                ..Default::default()
            },
        },
        Case {
            name: "a_created_container_that_did_not_start_waits_for_kubelets_reason",
            pod: Some(pod_with(
                always(&["app", "side"]),
                api_status(
                    "Pending",
                    vec![waiting_for("app", "RunContainerError"), waiting_for("side", "ErrImagePull")],
                    vec![],
                ),
            )),
            previous: None,
            view: view(vec![cv("app", 0, Created), cv("side", 0, Created)]),
            now: t(20),
            expect: Expect {
                phase: Some("Pending"),
                // An image pull error is older than a created container: not kept.
                containers: &[
                    ("app", "waiting:RunContainerError", 0, "-"),
                    ("side", "waiting:", 0, "-"),
                ],
                unknown: vec![Unknown::KubeletReason("app".into())],
                ..Default::default()
            },
        },
        // RestartAllContainers (KEP-5532): the trigger's exit, then every container removed.
        Case {
            name: "restart_all_containers_starts_with_kubelets_condition",
            pod: Some(restart_all_pod()),
            previous: None,
            view: view(vec![
                exited("setup", 0, 0, "Completed"),
                cv("job", 0, Running),
                exited("trigger", 0, 42, "Error"),
            ]),
            now: t(20),
            expect: Expect {
                phase: Some("Running"),
                containers: &[
                    ("job", "running", 0, "-"),
                    ("trigger", "terminated:Error:42", 0, "-"),
                ],
                conditions: &[
                    ("AllContainersRestarting", "True", "RestartAllContainersStarted"),
                    ("Initialized", "True", ""),
                ],
                ..Default::default()
            },
        },
        Case {
            name: "restart_all_containers_every_removed_container_waits_to_run_again",
            pod: Some(restart_all_pod()),
            previous: Some(PodStatus {
                phase: Some("Running".into()),
                init_container_statuses: Some(vec![kstatus("setup:T0,ready")]),
                container_statuses: Some(vec![kstatus("job:R,ready"), kstatus("trigger:T42")]),
                conditions: Some(
                    [("AllContainersRestarting", "True"), ("Initialized", "True")]
                        .map(|(t, s)| PodCondition {
                            type_: t.into(),
                            status: s.into(),
                            ..Default::default()
                        })
                        .to_vec(),
                ),
                ..Default::default()
            }),
            view: view(vec![]),
            now: t(20),
            expect: Expect {
                phase: Some("Running"),
                init: &[("setup", RAC_WAITING, 1, RAC_LAST_STATE)],
                containers: &[
                    ("job", RAC_WAITING, 1, RAC_LAST_STATE),
                    ("trigger", RAC_WAITING, 1, RAC_LAST_STATE),
                ],
                conditions: &[
                    // Every container removed: kubelet starts them again.
                    ("AllContainersRestarting", "False", ""),
                    // Initialized before, it stays so while the init containers run again.
                    ("Initialized", "True", ""),
                ],
                ..Default::default()
            },
        },
        Case {
            name: "on_failure_does_not_back_off_a_success",
            pod: Some(policy("OnFailure", &["job"])),
            previous: None,
            view: view(vec![
                exited("job", 0, 1, "Error"),
                exited("job", 1, 0, "Completed"),
            ]),
            now: t(16),
            expect: Expect {
                containers: &[("job", "terminated:Completed:0", 1, "terminated:Error:1")],
                phase: Some("Succeeded"),
                ..Default::default()
            },
        },
        Case {
            name: "the_previous_instance_is_the_last_state_of_a_running_container",
            pod: Some(always(&["app"])),
            previous: None,
            view: view(vec![
                exited("app", 0, 137, "OOMKilled"),
                cv("app", 1, Running),
            ]),
            now: t(100),
            expect: Expect {
                containers: &[("app", "running", 1, "terminated:OOMKilled:137")],
                phase: Some("Running"),
                ..Default::default()
            },
        },
        Case {
            name: "init_oom_killed_is_oomkilled_even_when_the_runtime_says_error_137",
            pod: Some(always(&["app"])),
            previous: None,
            view: view(vec![oomed(exited("app", 0, 137, "Error"), 4000, true)]),
            now: t(6),
            expect: Expect {
                containers: &[("app", "terminated:OOMKilled:137", 0, "-")],
                extra: Some(|out| {
                    let s = &out.status.container_statuses.as_ref().unwrap()[0];
                    let term = s.state.as_ref().unwrap().terminated.as_ref().unwrap();
                    assert_eq!(term.signal, Some(9));
                    assert_eq!(
                        term.container_id.as_deref(),
                        Some("containerd://0000000000000000000000000000000000000000000000000000006170700000")
                    );
                }),
                ..Default::default()
            },
        },
        Case {
            name: "child_oom_kill_under_an_init_that_went_on_is_the_inits_own_exit",
            pod: Some(policy("Never", &["app"])),
            previous: None,
            // containerd says OOMKilled / 0 here (kubernetes#104454).
            view: view(vec![oomed(exited("app", 0, 0, "OOMKilled"), 4100, false)]),
            now: t(6),
            expect: Expect {
                containers: &[("app", "terminated:Completed:0", 0, "-")],
                phase: Some("Succeeded"),
                ..Default::default()
            },
        },
        Case {
            name: "group_oom_kill_takes_the_init_with_sigkill_and_is_oomkilled",
            pod: Some(policy("Never", &["app"])),
            previous: None,
            // memory.oom.group=1: the last victim recorded is a child, the init died of SIGKILL.
            view: view(vec![oomed(exited("app", 0, 137, "OOMKilled"), 4100, false)]),
            now: t(6),
            expect: Expect {
                containers: &[("app", "terminated:OOMKilled:137", 0, "-")],
                phase: Some("Failed"),
                ..Default::default()
            },
        },
        Case {
            name: "a_signal_death_reports_128_plus_the_signal_and_the_signal",
            pod: Some(policy("Never", &["app"])),
            previous: None,
            view: view(vec![exited("app", 0, 143, "Error")]),
            now: t(6),
            expect: Expect {
                containers: &[("app", "terminated:Error:143", 0, "-")],
                extra: Some(|out| {
                    let s = &out.status.container_statuses.as_ref().unwrap()[0];
                    let term = s.state.as_ref().unwrap().terminated.as_ref().unwrap();
                    assert_eq!(term.signal, Some(15));
                    assert_eq!(term.finished_at, Some(to_time(t(5))));
                }),
                ..Default::default()
            },
        },
        Case {
            name: "unknown_state_after_running_is_status_unknown_137_and_a_restart",
            pod: Some(pod_with(
                always(&["app"]),
                api_status(
                    "Running",
                    vec![running_status(
                        "app",
                        "0000000000000000000000000000000000000000000000000000006170700000",
                        true,
                        true,
                    )],
                    vec![],
                ),
            )),
            previous: None,
            view: view(vec![cv("app", 0, Lost)]),
            now: t(100),
            expect: Expect {
                containers: &[("app", "terminated:ContainerStatusUnknown:137", 1, "-")],
                ..Default::default()
            },
        },
        Case {
            name: "container_the_runtime_lost_after_running_gets_an_unknown_last_state",
            pod: Some(pod_with(
                always(&["app"]),
                api_status(
                    "Running",
                    vec![running_status("app", "gone", true, true)],
                    vec![],
                ),
            )),
            previous: None,
            view: view(vec![]),
            now: t(100),
            expect: Expect {
                containers: &[(
                    "app",
                    "waiting:ContainerCreating",
                    1,
                    "terminated:ContainerStatusUnknown:137",
                )],
                ..Default::default()
            },
        },
        Case {
            name: "a_readiness_probe_result_is_said_unknown_not_guessed",
            pod: Some(pod(
                spec(
                    "Always",
                    vec![],
                    vec![with_readiness_probe(container("app"))],
                ),
                None,
            )),
            previous: None,
            view: view(vec![cv("app", 0, Running)]),
            now: t(100),
            expect: Expect {
                ready: &[("app", false, Some(true))],
                conditions: &[("Ready", "False", "ContainersNotReady")],
                unknown: vec![
                    Unknown::Readiness("app".into()),
                    Unknown::ImageId("app".into()),
                ],
                ..Default::default()
            },
        },
        Case {
            name: "kubelets_readiness_for_the_same_container_id_is_kept",
            pod: Some(pod(
                spec(
                    "Always",
                    vec![],
                    vec![with_readiness_probe(container("app"))],
                ),
                Some(api_status(
                    "Running",
                    vec![running_status(
                        "app",
                        "0000000000000000000000000000000000000000000000000000006170700000",
                        true,
                        true,
                    )],
                    vec![],
                )),
            )),
            previous: None,
            view: view(vec![cv("app", 0, Running)]),
            now: t(100),
            expect: Expect {
                ready: &[("app", true, Some(true))],
                conditions: &[("Ready", "True", "")],
                extra: Some(|out| {
                    let s = &out.status.container_statuses.as_ref().unwrap()[0];
                    assert_eq!(
                        s.image_id, "sha256:feed",
                        "image digest kept for the same id"
                    );
                }),
                ..Default::default()
            },
        },
        Case {
            name: "a_new_instance_does_not_inherit_the_old_ones_readiness",
            pod: Some(pod(
                spec(
                    "Always",
                    vec![],
                    vec![with_readiness_probe(container("app"))],
                ),
                Some(api_status(
                    "Running",
                    vec![running_status(
                        "app",
                        "0000000000000000000000000000000000000000000000000000006170700000",
                        true,
                        true,
                    )],
                    vec![],
                )),
            )),
            previous: None,
            view: view(vec![exited("app", 0, 1, "Error"), cv("app", 1, Running)]),
            now: t(100),
            expect: Expect {
                ready: &[("app", false, Some(true))],
                ..Default::default()
            },
        },
        Case {
            name: "a_startup_probe_result_is_unknown_so_not_started",
            pod: Some(pod(
                spec(
                    "Always",
                    vec![],
                    vec![{
                        let mut c = container("app");
                        c.startup_probe = Some(Default::default());
                        c
                    }],
                ),
                None,
            )),
            previous: None,
            view: view(vec![cv("app", 0, Running)]),
            now: t(100),
            expect: Expect {
                ready: &[("app", false, Some(false))],
                unknown: vec![Unknown::Startup("app".into())],
                ..Default::default()
            },
        },
        Case {
            name: "a_readiness_gate_without_its_condition_holds_ready_false",
            pod: Some(pod(
                with_gate(
                    spec("Always", vec![], vec![container("app")]),
                    "example.com/lb",
                ),
                None,
            )),
            previous: None,
            view: view(vec![cv("app", 0, Running)]),
            now: t(100),
            expect: Expect {
                conditions: &[
                    ("ContainersReady", "True", ""),
                    ("Ready", "False", "ReadinessGatesNotReady"),
                ],
                ..Default::default()
            },
        },
        Case {
            name: "a_readiness_gate_on_containers_alive_is_met_by_the_observers_condition",
            pod: Some(pod(
                with_gate(
                    spec("Always", vec![], vec![container("app")]),
                    "observer.dev/ContainersAlive",
                ),
                None,
            )),
            previous: None,
            view: view(vec![cv("app", 0, Running)]),
            now: t(100),
            expect: Expect {
                conditions: &[
                    (
                        "observer.dev/ContainersAlive",
                        "True",
                        "AllContainersRunning",
                    ),
                    ("Ready", "True", ""),
                ],
                ..Default::default()
            },
        },
        Case {
            name: "a_sidecar_running_but_not_started_keeps_the_pod_pending",
            pod: Some(pod(
                spec(
                    "Always",
                    vec![{
                        let mut c = sidecar("proxy");
                        c.startup_probe = Some(Default::default());
                        c
                    }],
                    vec![container("app")],
                ),
                None,
            )),
            previous: None,
            view: view(vec![cv("proxy", 0, Running)]),
            now: t(100),
            expect: Expect {
                phase: Some("Pending"),
                init: &[("proxy", "running", 0, "-")],
                containers: &[("app", "waiting:PodInitializing", 0, "-")],
                conditions: &[("Initialized", "False", "ContainersNotInitialized")],
                ..Default::default()
            },
        },
        Case {
            name: "a_sidecar_restarting_after_initialization_keeps_the_pod_running",
            pod: Some(pod(
                spec("Always", vec![sidecar("proxy")], vec![container("app")]),
                None,
            )),
            previous: None,
            view: view(vec![exited("proxy", 0, 1, "Error"), cv("app", 0, Running)]),
            now: t(100),
            expect: Expect {
                phase: Some("Running"),
                init: &[("proxy", "terminated:Error:1", 0, "-")],
                conditions: &[
                    ("Initialized", "True", ""),
                    ("ContainersReady", "False", "ContainersNotReady"),
                ],
                ..Default::default()
            },
        },
        Case {
            name: "a_crash_looping_sidecar_backs_off_even_under_never",
            pod: Some(pod(
                spec("Never", vec![sidecar("proxy")], vec![container("app")]),
                None,
            )),
            previous: None,
            view: view(vec![
                exited("proxy", 0, 1, "Error"),
                exited("proxy", 1, 1, "Error"),
                cv("app", 0, Running),
            ]),
            now: t(16),
            expect: Expect {
                phase: Some("Running"),
                init: &[("proxy", "waiting:CrashLoopBackOff", 1, "terminated:Error:1")],
                ..Default::default()
            },
        },
        Case {
            name: "conditions_kubelet_does_not_own_are_kept_from_the_api",
            pod: Some(pod_with(
                always(&["app"]),
                api_status(
                    "Running",
                    vec![],
                    vec![PodCondition {
                        type_: "example.com/Synced".into(),
                        status: "True".into(),
                        ..Default::default()
                    }],
                ),
            )),
            previous: None,
            view: view(vec![cv("app", 0, Running)]),
            now: t(100),
            expect: Expect {
                conditions: &[("example.com/Synced", "True", "")],
                ..Default::default()
            },
        },
        Case {
            name: "last_transition_time_is_kept_while_a_condition_is_unchanged",
            pod: Some(always(&["app"])),
            previous: Some(api_status(
                "Running",
                vec![],
                vec![
                    PodCondition {
                        type_: "Ready".into(),
                        status: "True".into(),
                        last_transition_time: Some(to_time(t(7))),
                        ..Default::default()
                    },
                    PodCondition {
                        type_: "ContainersReady".into(),
                        status: "False".into(),
                        last_transition_time: Some(to_time(t(7))),
                        ..Default::default()
                    },
                ],
            )),
            view: view(vec![cv("app", 0, Running)]),
            now: t(100),
            expect: Expect {
                extra: Some(|out| {
                    let s = &out.status;
                    let lt = |t: &str| cond(s, t).unwrap().last_transition_time.clone();
                    assert_eq!(lt("Ready"), Some(to_time(t(7))), "unchanged: kept");
                    assert_eq!(lt("ContainersReady"), Some(to_time(t(100))), "changed: now");
                    assert_eq!(s.start_time, Some(to_time(t(0))), "start time kept");
                }),
                ..Default::default()
            },
        },
        Case {
            name: "start_time_is_the_sandbox_creation_when_nothing_was_written",
            pod: Some(always(&["app"])),
            previous: None,
            view: view(vec![cv("app", 0, Running)]),
            now: t(100),
            expect: Expect {
                extra: Some(|out| assert_eq!(out.status.start_time, Some(to_time(t(0))))),
                ..Default::default()
            },
        },
        Case {
            name: "a_sandbox_not_ready_is_pod_ready_to_start_containers_false",
            pod: Some(always(&["app"])),
            previous: None,
            view: {
                let mut v = view(vec![]);
                v.sandbox_ready = false;
                v
            },
            now: t(100),
            expect: Expect {
                phase: Some("Pending"),
                // 1.37 says why (GeneratePodReadyToStartContainersCondition).
                conditions: &[("PodReadyToStartContainers", "False", "PodSandboxNotReady")],
                extra: Some(|out| {
                    let c = cond(&out.status, "PodReadyToStartContainers").unwrap();
                    assert_eq!(c.message.as_deref(), Some("pod sandbox is not ready"));
                }),
                ..Default::default()
            },
        },
        Case {
            name: "regular_statuses_are_sorted_by_name_init_ones_kept_in_spec_order",
            pod: Some(pod(
                spec(
                    "Always",
                    vec![container("zinit"), container("ainit")],
                    vec![container("zeta"), container("alpha")],
                ),
                None,
            )),
            previous: None,
            view: view(vec![
                exited("zinit", 0, 0, "Completed"),
                exited("ainit", 0, 0, "Completed"),
                cv("zeta", 0, Running),
                cv("alpha", 0, Running),
            ]),
            now: t(100),
            expect: Expect {
                containers: &[("alpha", "running", 0, "-"), ("zeta", "running", 0, "-")],
                init: &[
                    ("zinit", "terminated:Completed:0", 0, "-"),
                    ("ainit", "terminated:Completed:0", 0, "-"),
                ],
                ..Default::default()
            },
        },
        Case {
            name: "without_a_spec_what_cannot_be_known_is_said",
            pod: None,
            previous: None,
            view: view(vec![cv("app", 0, Running)]),
            now: t(100),
            expect: Expect {
                phase: Some("Running"),
                containers: &[("app", "running", 0, "-")],
                ready: &[("app", false, None)],
                unknown: vec![
                    Unknown::PodSpec,
                    Unknown::Readiness("app".into()),
                    Unknown::PodIps,
                ],
                extra: Some(|out| {
                    assert!(cond(&out.status, "Ready").is_none(), "Ready not claimed");
                    assert!(cond(&out.status, "observer.dev/ContainersAlive").is_some());
                }),
                ..Default::default()
            },
        },
        Case {
            name: "without_a_spec_every_container_stopped_leaves_the_phase_unknown",
            pod: None,
            previous: None,
            view: view(vec![exited("app", 0, 1, "Error")]),
            now: t(100),
            expect: Expect {
                phase: Some("-"),
                containers: &[("app", "terminated:Error:1", 0, "-")],
                unknown: vec![Unknown::Phase],
                ..Default::default()
            },
        },
        Case {
            name: "oom_killed_condition_appears_with_the_first_kill",
            pod: Some(pod(
                spec(
                    "Always",
                    vec![],
                    vec![with_memory_limit(container("app"), "64Mi")],
                ),
                None,
            )),
            previous: None,
            view: view(vec![oomed(cv("app", 0, Running), 4100, false)]),
            now: t(100),
            expect: Expect {
                conditions: &[
                    ("observer.dev/OOMKilled", "True", "ProcessOOMKilled"),
                    (
                        "observer.dev/ContainersAlive",
                        "True",
                        "AllContainersRunning",
                    ),
                    ("Ready", "True", ""),
                ],
                ..Default::default()
            },
        },
    ]
}

#[test]
fn kubelet_behaviours() {
    let cases = cases();
    assert!(cases.len() >= 30, "{} cases", cases.len());
    let mut names: Vec<&str> = cases.iter().map(|c| c.name).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), cases.len(), "case names are unique");
    // Every case runs; the failures are listed together.
    let failed: Vec<&str> = cases
        .into_iter()
        .filter_map(|c| {
            let name = c.name;
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(c)))
                .err()
                .map(|_| name)
        })
        .collect();
    assert!(failed.is_empty(), "failed cases: {failed:#?}");
}

#[test]
fn backoff_schedule_is_kubelets() {
    let secs = |r: u32| {
        let mut c = exited("app", r, 1, "Error");
        c.started_at = Some(t(0));
        c.finished_at = Some(t(5));
        backoff(&c).map(|d| d.as_secs())
    };
    assert_eq!(
        [0, 1, 2, 3, 4, 5, 6, 30].map(secs),
        [
            None,
            Some(10),
            Some(20),
            Some(40),
            Some(80),
            Some(160),
            Some(300),
            Some(300)
        ]
    );
}

#[test]
fn times_are_whole_seconds_in_json() {
    let v = serde_json::to_value(to_time(t(1) + std::time::Duration::from_millis(999))).unwrap();
    assert_eq!(v, "2023-11-14T22:13:21Z");
    let _unused: Option<Time> = None;
}

// ---------------------------------------------------------------------------------------------
// kubelet's own test cases (Kubernetes 1.37.2: pkg/kubelet's kubelet_pods_test.go,
// kubelet_test.go, status/generate_test.go, status/status_manager_test.go,
// container/helpers_test.go, kuberuntime/kuberuntime_manager_test.go, and
// pkg/api/v1/pod/util_test.go), one named case each, `<kubelet test>/<case>` (`#i` for
// kubelet's unnamed table rows), with kubelet's expected output. Cases whose inputs the agent
// cannot have are in `LEFT_OUT`, each with its reason.
// ---------------------------------------------------------------------------------------------

use k8s_openapi::api::core::v1::{
    ContainerRestartRule, ContainerRestartRuleOnExitCodes, ContainerStateTerminated,
    ContainerStateWaiting, PodReadinessGate,
};

use super::kubelet::{
    all_containers_restarting_condition, containers_ready_condition, get_phase,
    initialized_condition, matching_rule, pod_ready_condition, ready_to_start_containers_condition,
    Convert, ReasonCache, Sandbox,
};

const RAC_MSG: &str = "The container is removed because RestartAllContainers in place";

/// A spec container: `name`, then `*` (a sidecar: restartPolicy Always), `@Policy` (its own
/// restart policy), `!code` (a RestartAllContainers rule on that exit code).
fn kcontainer(tok: &str) -> k8s_openapi::api::core::v1::Container {
    let (tok, rule) = match tok.split_once('!') {
        Some((t, code)) => (t, Some(code.parse::<i32>().expect("an exit code"))),
        None => (tok, None),
    };
    let (tok, policy) = match tok.split_once('@') {
        Some((t, p)) => (t, Some(p.to_string())),
        None => (tok, None),
    };
    let (name, sidecar) = match tok.strip_suffix('*') {
        Some(n) => (n, true),
        None => (tok, false),
    };
    let mut c = container(name);
    c.restart_policy = policy.or_else(|| sidecar.then(|| "Always".to_string()));
    c.restart_policy_rules = rule.map(|code| {
        vec![ContainerRestartRule {
            action: "RestartAllContainers".into(),
            exit_codes: Some(ContainerRestartRuleOnExitCodes {
                operator: "In".into(),
                values: Some(vec![code]),
            }),
        }]
    });
    c
}

fn kpod(policy: &str, init: &str, containers: &str) -> Pod {
    let list = |s: &str| -> Vec<_> {
        s.split(',')
            .filter(|t| !t.is_empty())
            .map(kcontainer)
            .collect()
    };
    pod(spec(policy, list(init), list(containers)), None)
}

fn terminated(code: i32) -> ContainerState {
    ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code: code,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// kubelet's test helpers as a status: `name:STATE[,ready][,started][,unstarted]`. STATE: `R`
/// running, `S` running and started, `W` waiting, `W+LT<code>` waiting after a termination,
/// `T<code>` terminated, `WRAC` kubelet's RestartAllContainers waiting state, `-` no state.
fn kstatus(tok: &str) -> ContainerStatus {
    let (name, rest) = tok.split_once(':').expect("name:STATE");
    let mut parts = rest.split(',');
    let st = parts.next().unwrap_or("-");
    let mut s = ContainerStatus {
        name: name.into(),
        ..Default::default()
    };
    let w = |reason: Option<&str>, message: Option<&str>| ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: reason.map(str::to_string),
            message: message.map(str::to_string),
        }),
        ..Default::default()
    };
    s.state = Some(match st {
        "R" | "S" => {
            s.started = (st == "S").then_some(true);
            ContainerState {
                running: Some(ContainerStateRunning::default()),
                ..Default::default()
            }
        }
        "W" => w(None, None),
        "WRAC" => {
            s.last_state = Some(ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: 137,
                    reason: Some("RestartingAllContainers".into()),
                    message: Some(RAC_MSG.into()),
                    ..Default::default()
                }),
                ..Default::default()
            });
            w(Some("RestartingAllContainers"), Some(RAC_MSG))
        }
        "-" => ContainerState::default(),
        _ => match (st.strip_prefix("W+LT"), st.strip_prefix('T')) {
            (Some(code), _) => {
                s.last_state = Some(terminated(code.parse().expect("exit code")));
                w(None, None)
            }
            (None, Some(code)) => terminated(code.parse().expect("exit code")),
            _ => panic!("unknown state {st}"),
        },
    });
    for f in parts {
        match f {
            "ready" => s.ready = true,
            "started" => s.started = Some(true),
            "unstarted" => s.started = Some(false),
            _ => panic!("unknown flag {f}"),
        }
    }
    s
}

/// Space-separated statuses; `nil`: Go's nil list.
fn kstatuses(list: &str) -> Option<Vec<ContainerStatus>> {
    (list != "nil").then(|| list.split_whitespace().map(kstatus).collect())
}

/// One table row: fields separated by `|`, trimmed.
fn fields<const N: usize>(row: &str) -> [&str; N] {
    let v: Vec<&str> = row.split('|').map(str::trim).collect();
    v.try_into()
        .unwrap_or_else(|v: Vec<&str>| panic!("{row}: {} fields, not {N}", v.len()))
}

/// kubelet's `getPhase` tables. A table's rows are `case | statuses | podIsTerminal
/// podHasInitialized | phase` for its pod (restart policy, init containers, containers); rows
/// of tables whose pods differ per case start `case | policy | init | containers | …`.
struct PhaseTable {
    test: &'static str,
    /// (restart policy, init containers, containers), for rows that do not say.
    pod: (&'static str, &'static str, &'static str),
    rows: &'static [&'static str],
}

const PHASE_TABLES: &[PhaseTable] = &[
    PhaseTable {
        test: "TestPodPhaseWithRestartAlways",
        pod: ("Always", "", "A,B"),
        rows: &[
            "waiting | | F F | Pending",
            "all running | A:R B:R | F F | Running",
            "all stopped with restart always | A:T0 B:T0 | F F | Running",
            "all succeeded with restart always, but the pod is terminal | A:T0 B:T0 | T F | Succeeded",
            "all stopped with restart always, but the pod is terminal | A:T0 B:T-1 | T F | Failed",
            "mixed state #1 with restart always | A:R B:T0 | F F | Running",
            "mixed state #2 with restart always | A:R | F F | Pending",
            "mixed state #3 with restart always | A:R B:W | F F | Pending",
            "backoff crashloop container with restart always | A:R B:W+LT0 | F F | Running",
        ],
    },
    PhaseTable {
        test: "TestPodPhaseWithRestartAlwaysInitContainers",
        pod: ("Always", "X", "A,B"),
        rows: &[
            "empty, waiting | | F F | Pending",
            "init container running | X:R | F F | Pending",
            "init container terminated non-zero | X:T-1 | F F | Pending",
            "init container waiting, terminated zero | X:W+LT0 | F F | Pending",
            "init container waiting, terminated non-zero | X:W+LT-1 | F F | Pending",
            "init container waiting, not terminated | X:W | F F | Pending",
            "init container succeeded | X:T0 A:R B:R | F F | Running",
        ],
    },
    PhaseTable {
        test: "TestPodPhaseWithRestartAlwaysRestartableInitContainers",
        pod: ("Always", "X*", "A,B"),
        rows: &[
            "empty, waiting | | F F | Pending",
            "restartable init container running | X:R | F F | Pending",
            "restartable init container stopped | X:T0 | F F | Pending",
            "restartable init container waiting, terminated zero | X:W+LT0 | F F | Pending",
            "restartable init container waiting, terminated non-zero | X:W+LT-1 | F F | Pending",
            "restartable init container waiting, not terminated | X:W | F F | Pending",
            "restartable init container started, 1/2 regular container running | X:S A:R | F T | Pending",
            "restartable init container started, all regular containers running | X:S A:R B:R | F T | Running",
            "restartable init container running, all regular containers running | X:R A:R B:R | F T | Running",
            "restartable init container stopped, all regular containers running | X:T0 A:R B:R | F T | Running",
            "backoff crashloop restartable init container, all regular containers running | X:W+LT0 A:R B:R | F T | Running",
            "all regular containers succeeded and restartable init container failed with restart always, but the pod is terminal | X:T-1 A:T0 B:T0 | T T | Succeeded",
            "all regular containers succeeded and restartable init container succeeded with restart always, but the pod is terminal | X:T0 A:T0 B:T0 | T T | Succeeded",
            "re-initializing the pod after the sandbox is recreated | X:R A:R B:R | F F | Pending",
        ],
    },
    PhaseTable {
        test: "TestPodPhaseWithRestartAlwaysAndPodHasRun",
        pod: ("Always", "X,Y*", "A"),
        rows: &[
            "regular init containers, restartable init container and regular container are all running | X:R Y:R A:R | F F | Pending",
            "regular containers is stopped, restartable init container and regular int container are both running | X:R Y:R A:T0 | F F | Pending",
            "re-created sandbox: regular init container is succeeded, restartable init container is running, old regular containers is stopped | X:T0 Y:R A:T0 | F F | Pending",
            "regular init container is succeeded, restartable init container is running, regular containers is stopped | X:T0 Y:R A:T0 | F T | Running",
            "regular init container is succeeded, restartable init container and regular containers are both running | X:T0 Y:R A:R | F T | Running",
        ],
    },
    PhaseTable {
        test: "TestPodPhaseWithRestartNever",
        pod: ("Never", "", "A,B"),
        rows: &[
            "waiting | | F F | Pending",
            "all running with restart never | A:R B:R | F F | Running",
            "all succeeded with restart never | A:T0 B:T0 | F F | Succeeded",
            "all failed with restart never | A:T-1 B:T-1 | F F | Failed",
            "mixed state #1 with restart never | A:R B:T0 | F F | Running",
            "mixed state #2 with restart never | A:R | F F | Pending",
            "mixed state #3 with restart never | A:R B:W | F F | Pending",
        ],
    },
    PhaseTable {
        test: "TestPodPhaseWithRestartNeverInitContainers",
        pod: ("Never", "X", "A,B"),
        rows: &[
            "empty, waiting | | F F | Pending",
            "init container running | X:R | F F | Pending",
            "init container terminated non-zero | X:T-1 | F F | Failed",
            "init container waiting, terminated zero | X:W+LT0 | F F | Pending",
            "init container waiting, terminated non-zero | X:W+LT-1 | F F | Failed",
            "init container waiting, not terminated | X:W | F F | Pending",
            "init container succeeded | X:T0 A:R B:R | F F | Running",
        ],
    },
    PhaseTable {
        test: "TestPodPhaseWithRestartNeverRestartableInitContainers",
        pod: ("Never", "X*", "A,B"),
        rows: &[
            "empty, waiting | | F F | Pending",
            "restartable init container running | X:R | F F | Pending",
            "restartable init container stopped | X:T0 | F F | Pending",
            "restartable init container waiting, terminated zero | X:W+LT0 | F F | Pending",
            "restartable init container waiting, terminated non-zero | X:W+LT-1 | F F | Pending",
            "restartable init container waiting, not terminated | X:W | F F | Pending",
            "restartable init container started, one main container running | X:S A:R | F T | Pending",
            "restartable init container started, main containers succeeded | X:S A:T0 B:T0 | F T | Running",
            "restartable init container re-running, main containers succeeded | X:R A:T0 B:T0 | F T | Running",
            "all containers succeeded | X:T0 A:T0 B:T0 | F T | Succeeded",
            "restartable init container terminated non-zero, main containers succeeded | X:T-1 A:T0 B:T0 | F T | Succeeded",
            "backoff crashloop restartable init container, main containers succeeded | X:W+LT0 A:T0 B:T0 | F T | Succeeded",
            "backoff crashloop with non-zero restartable init container, main containers succeeded | X:W+LT-1 A:T0 B:T0 | F T | Succeeded",
        ],
    },
    PhaseTable {
        test: "TestPodPhaseWithRestartOnFailure",
        pod: ("OnFailure", "", "A,B"),
        rows: &[
            "waiting | | F F | Pending",
            "all running with restart onfailure | A:R B:R | F F | Running",
            "all succeeded with restart onfailure | A:T0 B:T0 | F F | Succeeded",
            "all failed with restart never | A:T-1 B:T-1 | F F | Running",
            "mixed state #1 with restart onfailure | A:R B:T0 | F F | Running",
            "mixed state #2 with restart onfailure | A:R | F F | Pending",
            "mixed state #3 with restart onfailure | A:R B:W | F F | Pending",
            "backoff crashloop container with restart onfailure | A:R B:W+LT0 | F F | Running",
        ],
    },
    PhaseTable {
        test: "TestPodPhaseWithContainerRestartPolicy",
        pod: ("", "", ""),
        rows: &[
            "container with restart policy Never failed | Always | | container@Never | container:T-1 | F T | Failed",
            "container with restart policy OnFailure failed | Always | | container@OnFailure | container:T-1 | F T | Running",
            "container with restart policy Always failed | Always | | container@Always | container:T-1 | F T | Running",
            "At least one container with restartable container-level restart policy failed | Never | | A@Always,B | A:T0 B:T-1 | F T | Running",
            "All containers without restartable container-level restart policy failed | Always | | A@Never,B@OnFailure | A:T-1 B:T0 | F T | Failed",
            "All containers succeeded | Always | | A@Never,B@OnFailure | A:T0 B:T0 | F T | Succeeded",
        ],
    },
    PhaseTable {
        test: "TestPodPhaseWithContainerRestartPolicyInitContainers",
        pod: ("", "", ""),
        rows: &[
            "init container with restart policy Never failed | Always | init@Never | container | init:T-1 | F T | Failed",
            "init container with restart policy OnFailure failed | Never | init@OnFailure | container | init:T-1 | F T | Pending",
            "container with restart policy Always failed | Never | init@Always | container | init:T-1 | F T | Pending",
        ],
    },
    PhaseTable {
        test: "TestPodPhaseWithRestartAllContainers",
        pod: ("", "", ""),
        rows: &[
            "regular container triggers RestartAllContainers | Never | | container@Never!42 | container:T42 | F T | Running",
            "init container triggers RestartAllContainers | Never | container@Never!42 | | container:T42 regular:W | F T | Pending",
            "sidecar container triggers RestartAllContainers | Never | container*!42 | regular | container:T42 regular:W | F T | Pending",
            "sidecar container triggers RestartAllContainers, kills another init container | Never | container*!42,init | regular | container:T42 init:W regular:W | F T | Pending",
            "regular container triggers RestartAllContainers, cleaned up | Never | | container@Never!42 | container:WRAC | F T | Running",
            "init container triggers RestartAllContainers, cleaned up | Never | container@Never!42 | | container:WRAC regular:W | F T | Pending",
            "sidecar container triggers RestartAllContainers, cleaned up | Never | container*!42 | regular | container:WRAC regular:W | F T | Pending",
            "sidecar container triggers RestartAllContainers, kills another init container, cleaned up | Never | container*!42,init | regular | container:WRAC container:WRAC regular:W | F T | Pending",
            "regular container triggered RestartAllContainers; init container succeeded | Never | init | container@Never!42 | init:T0 container:WRAC | F T | Running",
            "regular container triggered RestartAllContainers; init container failed | Never | init | container@Never!42 | init:T-1 container:WRAC | F T | Failed",
            "init container triggered RestartAllContainers | Never | container@Never!42 | regular | container:T42 regular:W | F T | Pending",
            "init container triggered RestartAllContainers; init container succeeds | Never | container@Never!42 | regular | container:T0 regular:W | F T | Pending",
            "sidecar container triggered RestartAllContainers kills regular container | Never | container*!42 | regular | container:WRAC regular:WRAC | F T | Running",
            "sidecar container triggered RestartAllContainers kills regular container; sidecar running | Never | container*!42 | regular | container:R regular:WRAC | F T | Running",
            "sidecar container triggered RestartAllContainers; kills init container; sidecar running | Never | container*!42,init | regular | container:R container:WRAC regular:W | F T | Pending",
        ],
    },
];

fn flag(f: &str) -> bool {
    match f {
        "T" => true,
        "F" => false,
        _ => panic!("T or F, not {f}"),
    }
}

/// The phase row's name, and the check.
fn phase_rows() -> Vec<(String, Box<dyn Fn()>)> {
    let mut out: Vec<(String, Box<dyn Fn()>)> = Vec::new();
    for table in PHASE_TABLES {
        for row in table.rows {
            let v: Vec<&str> = row.split('|').map(str::trim).collect();
            let ((policy, init, containers), rest) = match v.len() {
                4 => (table.pod, &v[1..]),
                7 => ((v[1], v[2], v[3]), &v[4..]),
                n => panic!("{row}: {n} fields"),
            };
            let name = format!("{}/{}", table.test, v[0]);
            let pod = kpod(policy, init, containers);
            let statuses = kstatuses(rest[0]).unwrap_or_default();
            let flags: Vec<&str> = rest[1].split_whitespace().collect();
            let (terminal, initialized) = (flag(flags[0]), flag(flags[1]));
            let want = rest[2].to_string();
            let label = name.clone();
            out.push((
                name,
                Box::new(move || {
                    let got = get_phase(&pod, &statuses, terminal, initialized);
                    assert_eq!(got, want, "{label}");
                }),
            ));
        }
    }
    out
}

/// (status, reason, message) of a condition; `""` for none.
fn csum(c: &PodCondition) -> [String; 3] {
    [
        c.status.clone(),
        c.reason.clone().unwrap_or_default(),
        c.message.clone().unwrap_or_default(),
    ]
}

/// ContainersReady and Ready rows: `case | init | containers | statuses | phase | readiness
/// gates | existing conditions (type=Status) | status | reason | message`. Statuses `nil` is
/// Go's nil list; states `-` (none) since only readiness counts.
const CONTAINERS_READY_ROWS: &[&str] = &[
    "#0 | | | nil | Running | | | False | UnknownContainerStatuses |",
    "#1 | | | | Running | | | True | |",
    "#2 | | 1234 | | Running | | | False | ContainersNotReady | containers with unknown status: [1234]",
    "#3 | | 1234,5678 | 1234:-,ready 5678:-,ready | Running | | | True | |",
    "#4 | | 1234,5678 | 1234:-,ready | Running | | | False | ContainersNotReady | containers with unknown status: [5678]",
    "#5 | | 1234,5678 | 1234:-,ready 5678:- | Running | | | False | ContainersNotReady | containers with unready status: [5678]",
    "#6 | | 1234 | 1234:- | Succeeded | | | False | PodCompleted |",
    "#7 | restartable-init-1* | regular-1 | regular-1:-,ready | Running | | | False | ContainersNotReady | containers with unknown status: [restartable-init-1]",
    "#8 | restartable-init-1*,restartable-init-2* | regular-1 | restartable-init-1:-,ready restartable-init-2:-,ready regular-1:-,ready | Running | | | True | |",
    "#9 | restartable-init-1*,restartable-init-2* | regular-1 | restartable-init-1:-,ready regular-1:-,ready | Running | | | False | ContainersNotReady | containers with unknown status: [restartable-init-2]",
    "#10 | restartable-init-1*,restartable-init-2* | regular-1 | restartable-init-1:-,ready restartable-init-2:- regular-1:-,ready | Running | | | False | ContainersNotReady | containers with unready status: [restartable-init-2]",
];

const POD_READY_ROWS: &[&str] = &[
    "#0 | | | nil | Running | | | False | UnknownContainerStatuses |",
    "#1 | | | | Running | | | True | |",
    "#2 | | 1234 | | Running | | | False | ContainersNotReady | containers with unknown status: [1234]",
    "#3 | | 1234,5678 | 1234:-,ready 5678:-,ready | Running | | | True | |",
    "#4 | | 1234,5678 | 1234:-,ready | Running | | | False | ContainersNotReady | containers with unknown status: [5678]",
    "#5 | | 1234,5678 | 1234:-,ready 5678:- | Running | | | False | ContainersNotReady | containers with unready status: [5678]",
    "#6 | | 1234 | 1234:- | Succeeded | | | False | PodCompleted |",
    "#7 | | | | Running | gate1 | | False | ReadinessGatesNotReady | corresponding condition of pod readiness gate \"gate1\" does not exist.",
    "#8 | | | | Running | gate1 | gate1=False | False | ReadinessGatesNotReady | the status of pod readiness gate \"gate1\" is not \"True\", but False",
    "#9 | | | | Running | gate1 | gate1=True | True | |",
    "#10 | | | | Running | gate1,gate2 | gate1=True | False | ReadinessGatesNotReady | corresponding condition of pod readiness gate \"gate2\" does not exist.",
    "#11 | | | | Running | gate1,gate2 | gate1=True,gate2=False | False | ReadinessGatesNotReady | the status of pod readiness gate \"gate2\" is not \"True\", but False",
    "#12 | | | | Running | gate1,gate2 | gate1=True,gate2=True | True | |",
    "#13 | | 1234 | 1234:- | Running | gate1 | gate1=True | False | ContainersNotReady | containers with unready status: [1234]",
];

/// A ready row's pod, statuses, existing conditions, phase and expected condition.
struct ReadyInputs {
    pod: Pod,
    statuses: Option<Vec<ContainerStatus>>,
    conditions: Vec<PodCondition>,
    phase: String,
    want: [String; 3],
}

fn ready_inputs(row: &str) -> ReadyInputs {
    let [_, init, containers, statuses, phase, gates, conds, s, r, m] = fields::<10>(row);
    let mut pod = kpod("Always", init, containers);
    let gates: Vec<PodReadinessGate> = gates
        .split(',')
        .filter(|g| !g.is_empty())
        .map(|g| PodReadinessGate {
            condition_type: g.into(),
        })
        .collect();
    if let Some(spec) = pod.spec.as_mut() {
        spec.readiness_gates = (!gates.is_empty()).then_some(gates);
    }
    let conditions = conds
        .split(',')
        .filter(|c| !c.is_empty())
        .map(|c| {
            let (t, s) = c.split_once('=').expect("type=Status");
            PodCondition {
                type_: t.into(),
                status: s.into(),
                ..Default::default()
            }
        })
        .collect();
    ReadyInputs {
        pod,
        statuses: kstatuses(statuses),
        conditions,
        phase: phase.into(),
        want: [s.into(), r.into(), m.into()],
    }
}

/// Initialized rows: `case | init | containers | statuses | phase | status | reason` (kubelet's
/// test checks no message).
const INITIALIZED_ROWS: &[&str] = &[
    "#0 | 1234,5678 | regular | nil | Running | False | UnknownContainerStatuses",
    "#1 | | regular | | Running | True |",
    "#2 | 1234 | regular | | Running | False | ContainersNotInitialized",
    "#3 | 1234,5678 | regular | 1234:-,ready 5678:-,ready | Running | True |",
    "#4 | 1234,5678 | regular | 1234:-,ready | Running | False | ContainersNotInitialized",
    "#5 | 1234,5678 | regular | 1234:-,ready 5678:- | Running | False | ContainersNotInitialized",
    "#6 | 1234 | regular | 1234:-,ready | Succeeded | True | PodCompleted",
    "#7 | 1234* | regular | 1234:-,unstarted | Pending | False | ContainersNotInitialized",
    "#8 | 1234* | regular | 1234:-,started | Running | True |",
    "#9 | 1234* | regular | 1234:-,unstarted regular:R | Running | True |",
    "#10 | 1234 | regular | 1234:W regular:T0 | Running | True |",
];

/// PodReadyToStartContainers rows (status/generate_test.go): `case | hostNetwork | sandboxes
/// newest first, R (ready) or N, then :ip | status | reason | message`. The reason and message
/// of a False one are 1.37's (the 1.35 and 1.36 kubelets write none).
const SANDBOX_ROWS: &[&str] = &[
    "Empty pod status | F | | False | PodSandboxNotReady | no pod sandbox exists",
    "Pod sandbox status not ready | F | N:10.0.0.10 | False | PodSandboxNotReady | pod sandbox is not ready",
    "Pod with multiple ready sandboxes | F | R:10.0.0.10 R:10.0.0.11 | False | PodSandboxNotReady | multiple pod sandboxes are ready and need to be reconciled",
    "Pod sandbox status ready but network namespace mode changed | T | R:10.0.0.10 | False | PodSandboxNotReady | network namespace mode changed and sandbox needs to be recreated",
    "Pod sandbox status ready but no IP configured | F | R: | False | PodSandboxNotReady | pod sandbox has no IP address",
    "Pod sandbox status ready and IP configured | F | R:10.0.0.10 | True | |",
];

fn ksandboxes(list: &str) -> Vec<Sandbox> {
    list.split_whitespace()
        .map(|s| {
            let mut parts = s.split(':');
            let ready = parts.next() == Some("R");
            let ip = parts.next().unwrap_or("").to_string();
            Sandbox {
                ready,
                ip: Some(ip),
                // The sandbox's namespace mode is POD unless it says `host`.
                host_network: Some(parts.next() == Some("host")),
            }
        })
        .collect()
}

/// A reason cache as kubelet's tests fill it.
struct Reasons(&'static [(&'static str, &'static str)]);

impl ReasonCache for Reasons {
    fn get(&self, container: &str) -> Option<(String, Option<String>)> {
        self.0
            .iter()
            .find(|(c, _)| *c == container)
            .map(|(_, r)| (r.to_string(), None))
    }
}

/// A state as `waiting:<reason>`, `running`, `terminated:<reason>:<code>`, with `|<message>`
/// where there is one; `-` for none.
fn full_state(st: Option<&ContainerState>) -> String {
    let msg = |m: &Option<String>| m.as_ref().map(|m| format!("|{m}")).unwrap_or_default();
    match st {
        Some(ContainerState {
            waiting: Some(w), ..
        }) => format!(
            "waiting:{}{}",
            w.reason.as_deref().unwrap_or(""),
            msg(&w.message)
        ),
        Some(ContainerState {
            running: Some(_), ..
        }) => "running".into(),
        Some(ContainerState {
            terminated: Some(t),
            ..
        }) => format!(
            "terminated:{}:{}{}",
            t.reason.as_deref().unwrap_or(""),
            t.exit_code,
            msg(&t.message)
        ),
        _ => "-".into(),
    }
}

fn summary(list: &[ContainerStatus]) -> Vec<(String, String, i32, String)> {
    list.iter()
        .map(|s| {
            (
                s.name.clone(),
                full_state(s.state.as_ref()),
                s.restart_count,
                full_state(s.last_state.as_ref()),
            )
        })
        .collect()
}

fn want(rows: &[(&str, &str, i32, &str)]) -> Vec<(String, String, i32, String)> {
    rows.iter()
        .map(|(n, s, r, l)| (n.to_string(), s.to_string(), *r, l.to_string()))
        .collect()
}

const LOST_ON_DELETE: &str = "terminated:ContainerStatusUnknown:137|The container could not be \
                              located when the pod was deleted.  The container used to be Running";
const LOST_ON_TERMINATE: &str = "terminated:ContainerStatusUnknown:137|The container could not \
                                 be located when the pod was terminated";

fn old_running(name: &str) -> ContainerStatus {
    kstatus(&format!("{name}:R"))
}

fn old_terminated(name: &str, code: i32, restarts: i32) -> ContainerStatus {
    let mut s = kstatus(&format!("{name}:T{code}"));
    s.restart_count = restarts;
    s
}

/// An exited runtime instance; `restart` orders instances (a higher one is newer).
fn ex(name: &str, restart: u32, code: i32) -> crate::reconcile::ContainerView {
    let mut c = exited(
        name,
        restart,
        code,
        if code == 0 { "Completed" } else { "Error" },
    );
    c.signal = None;
    c
}

/// `convertToAPIContainerStatuses` cases: (name, pod, previous statuses, runtime instances,
/// has init, is init, reason cache, expected statuses).
struct ConvertCase {
    name: String,
    pod: Pod,
    previous: Vec<ContainerStatus>,
    runtime: Vec<crate::reconcile::ContainerView>,
    has_init: bool,
    is_init: bool,
    reasons: &'static [(&'static str, &'static str)],
    /// kubelet's `podRestarting` (RestartAllContainers in place).
    pod_restarting: bool,
    want: Vec<(String, String, i32, String)>,
}

fn deleted(mut p: Pod) -> Pod {
    p.metadata.deletion_timestamp = Some(to_time(t(50)));
    p
}

fn convert_cases() -> Vec<ConvertCase> {
    let mut v = Vec::new();
    let ab = || kpod("Always", "", "A,B");
    let t = "TestConvertToAPIContainerStatuses";
    v.push(ConvertCase {
        name: format!("{t}/no current status, with previous statuses and deletion"),
        pod: deleted(ab()),
        previous: vec![old_running("A"), old_running("B")],
        runtime: vec![],
        has_init: false,
        is_init: false,
        reasons: &[],
        pod_restarting: false,
        want: want(&[
            ("A", "waiting:ContainerCreating", 0, LOST_ON_DELETE),
            ("B", "waiting:ContainerCreating", 0, LOST_ON_DELETE),
        ]),
    });
    v.push(ConvertCase {
        name: format!("{t}/no current status, with previous statuses and no deletion"),
        pod: ab(),
        previous: vec![old_running("A"), old_running("B")],
        runtime: vec![],
        has_init: false,
        is_init: false,
        reasons: &[],
        pod_restarting: false,
        want: want(&[
            ("A", "waiting:ContainerCreating", 1, LOST_ON_DELETE),
            ("B", "waiting:ContainerCreating", 1, LOST_ON_DELETE),
        ]),
    });
    v.push(ConvertCase {
        name: format!("{t}/no current status, keeping previous restartCount"),
        pod: ab(),
        previous: vec![old_terminated("A", -1, 5), old_terminated("B", -1, 5)],
        runtime: vec![],
        has_init: false,
        is_init: false,
        reasons: &[],
        pod_restarting: false,
        want: want(&[
            ("A", "terminated::-1", 5, "-"),
            ("B", "terminated::-1", 5, "-"),
        ]),
    });
    // RestartAllContainers (on from 1.36): kubelet_pods_test.go runs these with the gate on.
    let rc = |mut s: ContainerStatus, n: i32| {
        s.restart_count = n;
        s
    };
    const RAC_WAIT: &str =
        "waiting:RestartingAllContainers|The container is removed because RestartAllContainers in place";
    const RAC_LAST: &str = "terminated:RestartingAllContainers:137|The container is removed because RestartAllContainers in place";
    let mut restarting = |case: &str,
                          previous: Vec<ContainerStatus>,
                          runtime: Vec<crate::reconcile::ContainerView>,
                          pod_restarting: bool,
                          rows: &[(&str, &str, i32, &str)]| {
        v.push(ConvertCase {
            name: format!("{t}/{case}"),
            pod: ab(),
            previous,
            runtime,
            has_init: false,
            is_init: false,
            reasons: &[],
            pod_restarting,
            want: want(rows),
        });
    };
    restarting(
        "currently running with lower restartCount; should keeping previous restartCount",
        vec![rc(kstatus("A:T-1"), 5), rc(kstatus("B:T-1"), 5)],
        vec![cv("A", 0, Running), cv("B", 0, Running)],
        false,
        &[
            ("A", "running", 6, "terminated::-1"),
            ("B", "running", 6, "terminated::-1"),
        ],
    );
    restarting(
        "containerB dies and triggers RestartAllContainers in place",
        vec![kstatus("A:R"), kstatus("B:R")],
        vec![cv("A", 0, Running), ex("B", 0, 42)],
        true,
        &[
            ("A", "running", 0, "-"),
            ("B", "terminated:Error:42", 0, "-"),
        ],
    );
    restarting(
        "containerB dies and triggers RestartAllContainers in place, containerA killed",
        vec![kstatus("A:R"), kstatus("B:T42")],
        vec![ex("A", 0, 137)],
        true,
        &[
            ("A", "terminated:Error:137", 0, "-"),
            ("B", RAC_WAIT, 1, RAC_LAST),
        ],
    );
    restarting(
        "containerB dies and triggers RestartAllContainers in place, containerA killed then removed",
        vec![kstatus("A:T137"), kstatus("B:T42")],
        vec![],
        true,
        &[("A", RAC_WAIT, 1, RAC_LAST), ("B", RAC_WAIT, 1, RAC_LAST)],
    );
    restarting(
        "containerB dies and triggers RestartAllContainers in place, containerA killed and removed together",
        vec![kstatus("A:R"), kstatus("B:T42")],
        vec![],
        true,
        &[("A", RAC_WAIT, 1, RAC_LAST), ("B", RAC_WAIT, 1, RAC_LAST)],
    );
    restarting(
        "containerB dies and triggers RestartAllContainers in place, containerA rerun",
        vec![rc(kstatus("A:WRAC"), 1), kstatus("B:T42")],
        vec![cv("A", 0, Running)],
        true,
        &[("A", "running", 1, RAC_LAST), ("B", RAC_WAIT, 1, RAC_LAST)],
    );
    restarting(
        "containerB dies and triggers RestartAllContainers in place, containerA succeeded",
        vec![rc(kstatus("A:R"), 1), kstatus("B:T42")],
        vec![ex("A", 0, 0)],
        true,
        &[
            ("A", "terminated:Completed:0", 1, "-"),
            ("B", RAC_WAIT, 1, RAC_LAST),
        ],
    );
    restarting(
        "containerB dies and triggers RestartAllContainers in place, containerA failed",
        vec![rc(kstatus("A:R"), 1), kstatus("B:T42")],
        vec![ex("A", 0, 1)],
        true,
        &[
            ("A", "terminated:Error:1", 1, "-"),
            ("B", RAC_WAIT, 1, RAC_LAST),
        ],
    );
    v.push(ConvertCase {
        name: format!("{t}/Unable to get init container status from container runtime and pod has been initialized, treat it as exited normally"),
        pod: kpod("Always", "init-1", "containerA"),
        previous: vec![],
        runtime: vec![cv("containerA", 0, Running)],
        has_init: true,
        is_init: true,
        reasons: &[],
        pod_restarting: false,
        want: want(&[(
            "init-1",
            "terminated:Completed:0|Unable to get init container status from container runtime and pod has been initialized, treat it as exited normally",
            0,
            "-",
        )]),
    });
    v.push(ConvertCase {
        name: format!("{t}/Unable to get sidecar container status from container runtime and pod has been initialized, sidecar container should be waiting"),
        pod: kpod("Always", "sidecar-1*", "containerA"),
        previous: vec![],
        runtime: vec![cv("containerA", 0, Running)],
        has_init: true,
        is_init: true,
        reasons: &[],
        pod_restarting: false,
        want: want(&[("sidecar-1", "waiting:PodInitializing", 0, "-")]),
    });

    // kubelet_test.go: each table runs for regular containers, then as init containers.
    for is_init in [false, true] {
        let run = if is_init { " (init containers)" } else { "" };
        let as_spec = |names: &str| {
            if is_init {
                kpod("OnFailure", names, "")
            } else {
                kpod("OnFailure", "", names)
            }
        };
        let t = "TestGenerateAPIPodStatusWithReasonCache";
        let default = if is_init {
            "waiting:PodInitializing"
        } else {
            "waiting:ContainerCreating"
        };
        v.push(ConvertCase {
            name: format!("{t}/#0{run}"),
            pod: as_spec("without-old-record,with-old-record"),
            previous: vec![ContainerStatus {
                name: "with-old-record".into(),
                last_state: Some(terminated(0)),
                ..Default::default()
            }],
            runtime: vec![],
            has_init: is_init,
            is_init,
            reasons: &[],
            pod_restarting: false,
            want: want(&[
                ("with-old-record", default, 0, "terminated::0"),
                ("without-old-record", default, 0, "-"),
            ]),
        });
        v.push(ConvertCase {
            name: format!("{t}/#1{run}"),
            pod: as_spec("running"),
            previous: vec![],
            runtime: vec![ex("running", 0, 1), cv("running", 1, Running)],
            has_init: is_init,
            is_init,
            reasons: &[],
            pod_restarting: false,
            want: want(&[("running", "running", 1, "terminated:Error:1")]),
        });
        v.push(ConvertCase {
            name: format!("{t}/#2{run}"),
            pod: as_spec("without-reason,with-reason"),
            previous: vec![],
            runtime: vec![
                ex("without-reason", 1, 1),
                ex("without-reason", 0, 3),
                ex("with-reason", 1, 2),
                ex("with-reason", 0, 4),
            ],
            has_init: is_init,
            is_init,
            reasons: &[("with-reason", "test-error")],
            pod_restarting: false,
            want: want(&[
                ("with-reason", "waiting:test-error", 1, "terminated:Error:2"),
                (
                    "without-reason",
                    "terminated:Error:1",
                    1,
                    "terminated:Error:3",
                ),
            ]),
        });
        v.push(ConvertCase {
            name: format!("{t}/#3{run}"),
            pod: as_spec("unknown"),
            previous: vec![old_running("unknown")],
            runtime: vec![cv("unknown", 0, Running), cv("unknown", 1, Lost)],
            has_init: is_init,
            is_init,
            reasons: &[],
            pod_restarting: false,
            want: want(&[("unknown", LOST_ON_TERMINATE, 1, "running")]),
        });
        let t = "TestGenerateAPIPodStatusWithDifferentRestartPolicies";
        for (case, policy, succeed, failed) in [
            (
                "Never (#0)",
                "Never",
                ("terminated:Completed:0", "terminated:Error:2"),
                ("terminated:Error:1", "terminated:Error:3"),
            ),
            (
                "OnFailure (#1)",
                "OnFailure",
                ("terminated:Completed:0", "terminated:Error:2"),
                ("waiting:test-error", "terminated:Error:1"),
            ),
            (
                "Always (#2)",
                "Always",
                if is_init {
                    // An init container that exited 0 is never restarted.
                    ("terminated:Completed:0", "terminated:Error:2")
                } else {
                    ("waiting:test-error", "terminated:Completed:0")
                },
                ("waiting:test-error", "terminated:Error:1"),
            ),
        ] {
            let names = "succeed,failed";
            v.push(ConvertCase {
                name: format!("{t}/{case}{run}"),
                pod: if is_init {
                    kpod(policy, names, "")
                } else {
                    kpod(policy, "", names)
                },
                previous: vec![],
                runtime: vec![
                    ex("succeed", 1, 0),
                    ex("succeed", 0, 2),
                    ex("failed", 1, 1),
                    ex("failed", 0, 3),
                ],
                has_init: is_init,
                is_init,
                reasons: &[("succeed", "test-error"), ("failed", "test-error")],
                pod_restarting: false,
                want: want(&[
                    ("failed", failed.0, 1, failed.1),
                    ("succeed", succeed.0, 1, succeed.1),
                ]),
            });
        }
    }
    // kubelet_test.go: the waiting state (the reason cache's) or the end kubelet shows under a
    // container's own restart policy and rules (ContainerRestartRules), pod policy Always.
    let t = "TestGenerateAPIPodStatusWithContainerRestartPolicies";
    for (case, containers, rows) in [
        (
            "container restart policy rules match",
            vec![ruled("failed", "Never", "Restart", 1)],
            &[("failed", "waiting:test-error", 1, "terminated:Error:1")][..],
        ),
        (
            "container restart policy rules not match",
            vec![ruled("failed", "Never", "Restart", 2)],
            &[("failed", "terminated:Error:1", 1, "terminated:Error:3")][..],
        ),
        (
            "container restart policy never",
            vec![
                own_policy("succeed", "Never"),
                own_policy("failed", "Never"),
            ],
            &[
                ("failed", "terminated:Error:1", 1, "terminated:Error:3"),
                ("succeed", "terminated:Completed:0", 1, "terminated:Error:2"),
            ][..],
        ),
        (
            "container restart policy OnFailure",
            vec![
                own_policy("succeed", "OnFailure"),
                own_policy("failed", "OnFailure"),
            ],
            &[
                ("failed", "waiting:test-error", 1, "terminated:Error:1"),
                ("succeed", "terminated:Completed:0", 1, "terminated:Error:2"),
            ][..],
        ),
        (
            "container restart policy Always",
            vec![
                own_policy("succeed", "Always"),
                own_policy("failed", "Always"),
            ],
            &[
                ("failed", "waiting:test-error", 1, "terminated:Error:1"),
                ("succeed", "waiting:test-error", 1, "terminated:Completed:0"),
            ][..],
        ),
    ] {
        v.push(ConvertCase {
            name: format!("{t}/{case}"),
            pod: pod(spec("Always", vec![], containers), None),
            previous: vec![],
            runtime: vec![
                ex("succeed", 1, 0),
                ex("failed", 1, 1),
                ex("succeed", 0, 2),
                ex("failed", 0, 3),
            ],
            has_init: false,
            is_init: false,
            reasons: &[("succeed", "test-error"), ("failed", "test-error")],
            pod_restarting: false,
            want: want(rows),
        });
    }
    let names: Vec<String> = (0..10).map(|i| format!("{i}container")).collect();
    let mut shuffled: Vec<_> = names.iter().map(|n| cv(n, 0, Running)).collect();
    shuffled.reverse();
    shuffled.swap(2, 7);
    v.push(ConvertCase {
        name: "TestGenerateAPIPodStatusWithSortedContainers/(single)".into(),
        pod: kpod("Always", "", &names.join(",")),
        previous: vec![],
        runtime: shuffled,
        has_init: false,
        is_init: false,
        reasons: &[],
        pod_restarting: false,
        want: names
            .iter()
            .map(|n| (n.clone(), "running".to_string(), 0, "-".to_string()))
            .collect(),
    });
    v
}

fn run_convert(c: &ConvertCase) {
    let view = view(c.runtime.clone());
    let reasons = Reasons(c.reasons);
    let conv = Convert {
        pod: &c.pod,
        view: &view,
        runtime: "containerd",
        reasons: &reasons,
        pod_restarting: c.pod_restarting,
    };
    let spec = c.pod.spec.as_ref().expect("a spec");
    let specs = if c.is_init {
        spec.init_containers.clone().unwrap_or_default()
    } else {
        spec.containers.clone()
    };
    // Stable over repeated calls, as kubelet's sorted-containers test checks five times.
    let first = conv.statuses(&specs, &c.previous, c.has_init, c.is_init);
    for _ in 0..4 {
        assert_eq!(
            conv.statuses(&specs, &c.previous, c.has_init, c.is_init),
            first,
            "{}: stable",
            c.name
        );
    }
    let mut want = c.want.clone();
    if c.is_init {
        // Init statuses keep the spec's order.
        want.sort_by_key(|w| specs.iter().position(|s| s.name == w.0));
    }
    assert_eq!(summary(&first), want, "{}", c.name);
}

/// kubelet's fake prober (`probetest.FakeManager`): every regular container ready.
struct FakeProber;

impl Prober for FakeProber {
    fn update(&self, _: &Pod, status: &mut PodStatus, _: &PodStatus, _: &mut Vec<Unknown>) {
        for s in status.container_statuses.iter_mut().flatten() {
            s.ready = true;
        }
    }
}

/// `Test_generateAPIPodStatus`: the whole status with kubelet's fake prober and an explicit
/// podIsTerminal. Conditions are compared by (type, status, reason) in order, the observer's
/// own types left aside.
struct GenerateCase {
    name: &'static str,
    pod: Pod,
    previous: Option<PodStatus>,
    runtime: Vec<crate::reconcile::ContainerView>,
    sandboxes: &'static str,
    terminal: bool,
    phase: &'static str,
    reason_message: (&'static str, &'static str),
    conditions: &'static [(&'static str, &'static str, &'static str)],
    statuses: Vec<(String, String, i32, String)>,
    init: Vec<(String, String, i32, String)>,
}

fn status_of(phase: &str, statuses: &[&str]) -> PodStatus {
    PodStatus {
        phase: (!phase.is_empty()).then(|| phase.to_string()),
        container_statuses: Some(statuses.iter().map(|s| kstatus(s)).collect()),
        ..Default::default()
    }
}

fn with_reason(mut s: PodStatus) -> PodStatus {
    s.reason = Some("Test".into());
    s.message = Some("test".into());
    s
}

fn disruption() -> PodCondition {
    PodCondition {
        type_: "DisruptionTarget".into(),
        status: "True".into(),
        ..Default::default()
    }
}

const RUNNING_CONDITIONS: &[(&str, &str, &str)] = &[
    ("PodReadyToStartContainers", "True", ""),
    ("Initialized", "True", ""),
    ("Ready", "True", ""),
    ("ContainersReady", "True", ""),
    ("PodScheduled", "True", ""),
];

const COMPLETED_NO_SANDBOX: &[(&str, &str, &str)] = &[
    ("PodReadyToStartContainers", "False", "PodSandboxNotReady"),
    ("Initialized", "True", "PodCompleted"),
    ("Ready", "False", "PodCompleted"),
    ("ContainersReady", "False", "PodCompleted"),
    ("PodScheduled", "True", ""),
];

fn generate_cases() -> Vec<GenerateCase> {
    let ab = || kpod("Always", "", "A,B");
    let wlu = |rc: i32| {
        want(&[
            ("A", "waiting:ContainerCreating", rc, LOST_ON_DELETE),
            ("B", "waiting:ContainerCreating", rc, LOST_ON_DELETE),
        ])
    };
    let with_api = |mut p: Pod, s: PodStatus| {
        p.status = Some(s);
        p
    };
    vec![
        GenerateCase {
            name: "pod disruption condition is copied over and the phase is set to failed when deleted",
            pod: deleted(with_api(ab(), PodStatus {
                conditions: Some(vec![disruption()]),
                ..status_of("Running", &["A:R", "B:R"])
            })),
            previous: Some(PodStatus {
                conditions: Some(vec![disruption()]),
                ..status_of("Running", &["A:R", "B:R"])
            }),
            runtime: vec![],
            sandboxes: "R:10.0.0.10",
            terminal: true,
            phase: "Failed",
            reason_message: ("", ""),
            conditions: &[
                ("DisruptionTarget", "True", ""),
                ("PodReadyToStartContainers", "True", ""),
                ("Initialized", "True", ""),
                ("Ready", "False", "PodFailed"),
                ("ContainersReady", "False", "PodFailed"),
                ("PodScheduled", "True", ""),
            ],
            statuses: wlu(0),
            init: vec![],
        },
        GenerateCase {
            name: "current status ready, with previous statuses and deletion",
            pod: deleted(with_api(ab(), status_of("Running", &["A:R", "B:R"]))),
            previous: Some(status_of("Running", &["A:R", "B:R"])),
            runtime: vec![],
            sandboxes: "R:10.0.0.10",
            terminal: false,
            phase: "Running",
            reason_message: ("", ""),
            conditions: RUNNING_CONDITIONS,
            statuses: wlu(0),
            init: vec![],
        },
        GenerateCase {
            name: "current status ready, with previous statuses and no deletion",
            pod: with_api(ab(), status_of("Running", &["A:R", "B:R"])),
            previous: Some(status_of("Running", &["A:R", "B:R"])),
            runtime: vec![],
            sandboxes: "R:10.0.0.10",
            terminal: false,
            phase: "Running",
            reason_message: ("", ""),
            conditions: RUNNING_CONDITIONS,
            statuses: wlu(1),
            init: vec![],
        },
        GenerateCase {
            name: "terminal phase cannot be changed (apiserver previous is succeeded)",
            pod: with_api(ab(), status_of("Succeeded", &["A:R", "B:R"])),
            previous: Some(status_of("", &["A:R", "B:R"])),
            runtime: vec![],
            sandboxes: "",
            terminal: false,
            phase: "Succeeded",
            reason_message: ("", ""),
            conditions: COMPLETED_NO_SANDBOX,
            statuses: wlu(1),
            init: vec![],
        },
        GenerateCase {
            name: "terminal phase from previous status must remain terminal, restartAlways",
            pod: with_api(ab(), status_of("Running", &["A:R", "B:R"])),
            previous: Some(with_reason(status_of("Succeeded", &["A:R", "B:R"]))),
            runtime: vec![],
            sandboxes: "",
            terminal: false,
            phase: "Succeeded",
            reason_message: ("Test", "test"),
            conditions: COMPLETED_NO_SANDBOX,
            statuses: wlu(1),
            init: vec![],
        },
        GenerateCase {
            name: "terminal phase from previous status must remain terminal, restartNever",
            pod: with_api(kpod("Never", "", "A,B"), status_of("Running", &["A:R", "B:R"])),
            previous: Some(with_reason(status_of("Succeeded", &["A:T0", "B:T0"]))),
            runtime: vec![],
            sandboxes: "",
            terminal: false,
            phase: "Succeeded",
            reason_message: ("Test", "test"),
            conditions: COMPLETED_NO_SANDBOX,
            statuses: want(&[
                ("A", "terminated::0", 0, "-"),
                ("B", "terminated::0", 0, "-"),
            ]),
            init: vec![],
        },
        GenerateCase {
            name: "running can revert to pending",
            pod: with_api(ab(), status_of("Running", &["A:R", "B:R"])),
            previous: Some(status_of("Running", &["A:W", "B:W"])),
            runtime: vec![],
            sandboxes: "R:10.0.0.10",
            terminal: false,
            phase: "Pending",
            reason_message: ("", ""),
            conditions: RUNNING_CONDITIONS,
            statuses: want(&[
                ("A", "waiting:ContainerCreating", 0, "-"),
                ("B", "waiting:ContainerCreating", 0, "-"),
            ]),
            init: vec![],
        },
        GenerateCase {
            name: "reason and message are preserved when phase doesn't change",
            pod: with_api(ab(), status_of("Running", &["A:W", "B:W"])),
            previous: Some(with_reason(status_of("Pending", &["A:W", "B:R"]))),
            runtime: vec![cv("B", 0, Running)],
            sandboxes: "R:10.0.0.10",
            terminal: false,
            phase: "Pending",
            reason_message: ("Test", "test"),
            conditions: RUNNING_CONDITIONS,
            statuses: want(&[
                ("A", "waiting:ContainerCreating", 0, "-"),
                ("B", "running", 0, "-"),
            ]),
            init: vec![],
        },
        GenerateCase {
            name: "reason and message are cleared when phase changes",
            pod: with_api(ab(), status_of("Pending", &["A:W", "B:W"])),
            previous: Some(with_reason(status_of("Pending", &["A:R", "B:R"]))),
            runtime: vec![cv("A", 0, Running), cv("B", 0, Running)],
            sandboxes: "R:10.0.0.10",
            terminal: false,
            phase: "Running",
            reason_message: ("", ""),
            conditions: RUNNING_CONDITIONS,
            statuses: want(&[("A", "running", 0, "-"), ("B", "running", 0, "-")]),
            init: vec![],
        },
        // The InPlacePodLevelResourcesVerticalScaling cases, apart from the resources (listed in
        // LEFT_OUT: kubelet's allocation and cgroup reads).
        GenerateCase {
            name: "InPlacePodLevelResourcesVerticalScaling enabled, pending pod",
            pod: with_api(kpod("Always", "", "A"), status_of("Pending", &[])),
            previous: None,
            runtime: vec![],
            sandboxes: "R:10.0.0.10",
            terminal: false,
            phase: "Pending",
            reason_message: ("", ""),
            conditions: RUNNING_CONDITIONS,
            statuses: want(&[("A", "waiting:ContainerCreating", 0, "-")]),
            init: vec![],
        },
        GenerateCase {
            name: "InPlacePodLevelResourcesVerticalScaling enabled, running pod",
            pod: with_api(kpod("Always", "", "A"), status_of("Running", &[])),
            previous: None,
            runtime: vec![cv("A", 0, Running)],
            sandboxes: "R:10.0.0.10",
            terminal: false,
            phase: "Running",
            reason_message: ("", ""),
            conditions: RUNNING_CONDITIONS,
            statuses: want(&[("A", "running", 0, "-")]),
            init: vec![],
        },
        GenerateCase {
            name: "InPlacePodLevelResourcesVerticalScaling enabled, succeeded pod",
            pod: with_api(kpod("Always", "", "A"), status_of("Succeeded", &[])),
            previous: None,
            runtime: vec![ex("A", 0, 0)],
            sandboxes: "R:10.0.0.10",
            terminal: true,
            phase: "Succeeded",
            reason_message: ("", ""),
            conditions: &[
                ("PodReadyToStartContainers", "True", ""),
                ("Initialized", "True", "PodCompleted"),
                ("Ready", "False", "PodCompleted"),
                ("ContainersReady", "False", "PodCompleted"),
                ("PodScheduled", "True", ""),
            ],
            statuses: want(&[("A", "terminated:Completed:0", 0, "-")]),
            init: vec![],
        },
        GenerateCase {
            name: "InPlacePodLevelResourcesVerticalScaling enabled, pod with init containers",
            pod: with_api(kpod("Always", "initA", "A"), status_of("Running", &[])),
            previous: None,
            runtime: vec![ex("initA", 0, 0), cv("A", 0, Running)],
            sandboxes: "R:10.0.0.10",
            terminal: false,
            phase: "Running",
            reason_message: ("", ""),
            conditions: RUNNING_CONDITIONS,
            statuses: want(&[("A", "running", 0, "-")]),
            init: want(&[("initA", "terminated:Completed:0", 0, "-")]),
        },
        GenerateCase {
            name: "InPlacePodLevelResourcesVerticalScaling enabled, no resources set",
            pod: with_api(ab(), status_of("Running", &[])),
            previous: None,
            runtime: vec![cv("A", 0, Running), cv("B", 0, Running)],
            sandboxes: "R:10.0.0.10",
            terminal: false,
            phase: "Running",
            reason_message: ("", ""),
            conditions: RUNNING_CONDITIONS,
            statuses: want(&[("A", "running", 0, "-"), ("B", "running", 0, "-")]),
            init: vec![],
        },
    ]
}

fn run_generate(c: &GenerateCase) {
    let types = ConditionTypes::default();
    let view = view(c.runtime.clone());
    let g = Generate {
        pod: &c.pod,
        view: &view,
        previous: c.previous.as_ref(),
        now: t(100),
        runtime: "containerd",
        types: &types,
        pod_is_terminal: c.terminal,
        sandboxes: ksandboxes(c.sandboxes),
        reasons: &Reasons(&[]),
        prober: &FakeProber,
    };
    let s = generate_api_pod_status(&g, &mut Vec::new());
    let name = format!("Test_generateAPIPodStatus/{}", c.name);
    assert_eq!(s.phase.as_deref(), Some(c.phase), "{name}: phase");
    assert_eq!(
        (
            s.reason.as_deref().unwrap_or(""),
            s.message.as_deref().unwrap_or("")
        ),
        c.reason_message,
        "{name}: reason and message"
    );
    let got: Vec<(String, String, String)> = s
        .conditions
        .iter()
        .flatten()
        .filter(|c| !types.owns(&c.type_))
        .map(|c| {
            (
                c.type_.clone(),
                c.status.clone(),
                c.reason.clone().unwrap_or_default(),
            )
        })
        .collect();
    let want_conditions: Vec<(String, String, String)> = c
        .conditions
        .iter()
        .map(|(a, b, r)| (a.to_string(), b.to_string(), r.to_string()))
        .collect();
    assert_eq!(got, want_conditions, "{name}: conditions");
    let list = s.container_statuses.unwrap_or_default();
    assert_eq!(summary(&list), c.statuses, "{name}: container statuses");
    assert!(
        list.iter().all(|s| s.ready),
        "{name}: the fake prober's readiness"
    );
    let init = s.init_container_statuses.unwrap_or_default();
    assert_eq!(summary(&init), c.init, "{name}: init container statuses");
    assert!(
        init.iter().all(|s| !s.ready),
        "{name}: init containers are not ready under the fake prober"
    );
}

/// Runtime instances as kubelet's tests list them in a `kubecontainer.PodStatus`, newest first
/// per name: `name:STATE[#restart]`, STATE `R` running, `C` created, `U` unknown, `T<code>`
/// exited. Without `#`, the first listed of a name is its newest.
fn kruntime(list: &str) -> Vec<crate::reconcile::ContainerView> {
    let toks: Vec<&str> = list.split_whitespace().collect();
    toks.iter()
        .enumerate()
        .map(|(i, tok)| {
            let (name, rest) = tok.split_once(':').expect("name:STATE");
            let (st, restart) = match rest.split_once('#') {
                Some((st, r)) => (st, r.parse::<u32>().expect("a restart count")),
                None => {
                    let later = toks[i + 1..]
                        .iter()
                        .filter(|t| t.split_once(':').map(|(n, _)| n) == Some(name))
                        .count();
                    (rest, later as u32)
                }
            };
            match st {
                "R" => cv(name, restart, Running),
                "C" => cv(name, restart, Created),
                "U" => cv(name, restart, Lost),
                _ => ex(
                    name,
                    restart,
                    st.strip_prefix('T')
                        .and_then(|c| c.parse().ok())
                        .unwrap_or_else(|| panic!("unknown state {st}")),
                ),
            }
        })
        .collect()
}

/// Restart rules, `;`-separated: `Action:Operator:code,code`.
fn krules(list: &str) -> Option<Vec<ContainerRestartRule>> {
    let rules: Vec<ContainerRestartRule> = list
        .split(';')
        .filter(|r| !r.is_empty())
        .map(|r| {
            let [action, op, codes] = r.splitn(3, ':').collect::<Vec<_>>()[..] else {
                panic!("{r}: Action:Operator:codes")
            };
            ContainerRestartRule {
                action: action.into(),
                exit_codes: Some(ContainerRestartRuleOnExitCodes {
                    operator: op.into(),
                    values: Some(
                        codes
                            .split(',')
                            .map(|c| c.parse().expect("a code"))
                            .collect(),
                    ),
                }),
            }
        })
        .collect();
    (!rules.is_empty()).then_some(rules)
}

fn opt(f: &str) -> Option<String> {
    (!f.is_empty()).then(|| f.to_string())
}

/// `TestContainerHasRestartablePolicy` (api/v1/pod/util_test.go, podutil's
/// `ContainerShouldRestart` with ContainerRestartRules and RestartAllContainers on): `case |
/// container policy | rules | pod policy | exit code | restarts`.
const SHOULD_RESTART_ROWS: &[&str] = &[
    "Rule: 'In' operator matches with 'Restart' action | Never | Restart:In:42,50,60 | | 42 | T",
    "Rule: 'NotIn' operator matches with 'Restart' action | Never | Restart:NotIn:0,1,2 | | 99 | T",
    "Rule: 'In' operator matches with 'RestartAllContainers' action | Never | RestartAllContainers:In:42,50,60 | | 42 | T",
    "Rule: 'In' operator does not match, should fall back to container policy | Never | Restart:In:10,20 | | 30 | F",
    "Rule: 'NotIn' operator does not match, should fall back to container policy | Never | Restart:NotIn:10,20 | | 10 | F",
    "Container Policy: 'Always' | Always | | Never | 0 | T",
    "Container Policy: 'OnFailure' with exit code 0 | OnFailure | | Never | 0 | F",
    "Container Policy: 'OnFailure' with non-zero exit code | OnFailure | | Never | 1 | T",
    "Container Policy: 'Never' should return false | Never | | Always | 1 | F",
    "Pod Policy: Fallback to pod 'Always' | | | Always | 0 | T",
    "Pod Policy: Fallback to pod 'OnFailure' with non-zero exit code | | | OnFailure | 1 | T",
    "Pod Policy: Fallback to pod 'Never' | | | Never | 1 | F",
    "Pod Policy: Fallback with no policies specified should return true | | | | 0 | T",
];

/// `TestFindMatchingContainerRestartRule` (api/v1/pod/util_test.go): `case | rules | exit code |
/// the matched rule's index, or -`.
const MATCHING_RULE_ROWS: &[&str] = &[
    "a rule with op In matches | Restart:In:42,50,60 | 42 | 0",
    "a rule with op NotIn matches | Restart:NotIn:0,1,2 | 99 | 0",
    "matches the first rule if two rules both matched | Restart:In:42,50,60;Restart:In:42 | 42 | 0",
    "no rules matched | Restart:In:42,50,60 | 100 | -",
    "no rules defined | | 0 | -",
];

/// `TestAllContainersCouldRestart` (api/v1/pod/util_test.go): `case | init | containers |
/// expected` (kcontainer tokens: `!code` a RestartAllContainers rule).
const COULD_RESTART_ROWS: &[&str] = &[
    "Pod with rules in init containers | c!1 | | T",
    "Pod with rules in sidecar containers | c*!1 | | T",
    "Pod with rules in regular containers | | c@Always!1 | T",
    "Pod without rules | | | F",
];

/// `TestShouldAllContainersRestart` (container/helpers_test.go): `case | init | containers |
/// runtime | kubelet's AllContainersRestarting True | expected`.
const ALL_RESTART_ROWS: &[&str] = &[
    "pod marked with condition | | regular@Never | regular:R | T | T",
    "regular container exited with matching rules | | regular@Never!42 | regular:T42 | F | T",
    "init container exited with matching rules | init@Never!42 | | init:T42 | F | T",
    "sidecar container exited with matching rules | init*!42 | | init:T42 | F | T",
    "container exited without rules | | regular | regular:T1 | F | F",
];

/// `TestGenerateAllContainersRestartingCondition` (status/generate_test.go), its pod's
/// `container1` and `trigger` (Never, RestartAllContainers on 42): `case | runtime | kubelet's
/// AllContainersRestarting True | phase | status | reason | message`.
const ALL_RESTARTING_ROWS: &[&str] = &[
    "pod pending | | F | Pending | False | |",
    "pod failed | | F | Failed | False | PodFailed |",
    "pod succeeded | | F | Succeeded | False | PodCompleted |",
    "container triggers RestartAllContainers rule | container:R trigger:T42 | F | Running | True | RestartAllContainersStarted | container exited with restart policy rule",
    "container triggres RestartAllContainers rule, cleaning up | container:T0 trigger:T42 | T | Running | True | RestartAllContainersStarted | container exited with restart policy rule",
    "container triggres RestartAllContainers rule, cleaned up | | T | Pending | False | |",
];

/// `TestShouldContainerBeRestarted` (container/helpers_test.go): `pod restart policy | deleted |
/// whether no-history, alive, succeed, failed and unknown are restarted`, on its runtime.
const BE_RESTARTED_ROWS: &[&str] = &[
    "Never | F | T F F F T",
    "OnFailure | F | T F F T T",
    "Always | F | T F T T T",
    "Never | T | F F F F F",
    "OnFailure | T | F F F F F",
    "Always | T | F F F F F",
];

/// `TestComputePodActionsWithContainerRestartRules` (kuberuntime/kuberuntime_manager_test.go)
/// on `makeBasePodAndStatus`'s foo1..3: `case | pod policy | containers | runtime | the
/// stopped containers kubelet starts again`. What the status shows of it: those wait (the
/// reason cache's `CrashLoopBackOff` here) with their termination as the last state; the
/// others keep their state.
const POD_ACTION_ROWS: &[&str] = &[
    "restart exited containers if RestartPolicy == Always | Never | foo1@Always,foo2@Always,foo3 | foo1:T0 foo2:T111 foo3:R | foo1 foo2",
    "restart failed containers if RestartPolicy == OnFailure | Never | foo1@OnFailure,foo2@OnFailure,foo3 | foo1:T0 foo2:T111 foo3:R | foo2",
    "restart created but not started containers if RestartPolicy == OnFailure | Never | foo1@OnFailure,foo2@OnFailure,foo3 | foo1:T0 foo2:C foo3:R | foo2",
    "don't restart containers if RestartPolicy == Never | Always | foo1@Never,foo2@Never,foo3 | foo1:T0 foo2:T111 foo3:R |",
    "Kill pod and recreate all containers (except for the succeeded one) if the pod sandbox is dead | Always | foo1,foo2@OnFailure,foo3 | foo1:R foo2:T0 foo3:R |",
];

/// `TestDoBackOff` (kuberuntime/kuberuntime_manager_test.go): `case | runtime | the waiting
/// reason` at the instance's end, with kubelet's back-off (an entry once kubelet restarted it).
const BACKOFF_ROWS: &[&str] = &[
    "container running | foocontainer:R | -",
    "not in backoff | foocontainer:T1#0 | -",
    "in backoff | foocontainer:T1#1 | CrashLoopBackOff",
];

/// A status field, and a change of it.
type FieldChange = (&'static str, fn(&mut PodStatus));

/// The restart rules', RestartAllContainers', back-off's and observedGeneration's cases of
/// kubelet 1.37.2, beside the tables above.
fn restart_rows() -> Vec<(String, Box<dyn Fn()>)> {
    let mut out: Vec<(String, Box<dyn Fn()>)> = Vec::new();
    for row in SHOULD_RESTART_ROWS {
        let [case, policy, rules, pod_policy, code, want] = fields::<6>(row);
        let c = k8s_openapi::api::core::v1::Container {
            restart_policy: opt(policy),
            restart_policy_rules: krules(rules),
            ..Default::default()
        };
        let spec = k8s_openapi::api::core::v1::PodSpec {
            restart_policy: opt(pod_policy),
            ..Default::default()
        };
        let (code, want) = (code.parse().expect("a code"), flag(want));
        let name = format!("TestContainerHasRestartablePolicy/{case}");
        let label = name.clone();
        out.push((
            name,
            Box::new(move || {
                assert_eq!(container_should_restart(&c, &spec, code), want, "{label}");
            }),
        ));
    }
    for row in MATCHING_RULE_ROWS {
        let [case, rules, code, want] = fields::<4>(row);
        let c = k8s_openapi::api::core::v1::Container {
            restart_policy_rules: krules(rules),
            ..Default::default()
        };
        let code: i32 = code.parse().expect("a code");
        let want = want.parse::<usize>().ok();
        let name = format!("TestFindMatchingContainerRestartRule/{case}");
        let label = name.clone();
        out.push((
            name,
            Box::new(move || {
                let rules = c.restart_policy_rules.as_deref().unwrap_or(&[]);
                let got = matching_rule(&c, code).map(|r| {
                    rules
                        .iter()
                        .position(|x| std::ptr::eq(x, r))
                        .expect("one of its rules")
                });
                assert_eq!(got, want, "{label}");
            }),
        ));
    }
    for row in COULD_RESTART_ROWS {
        let [case, init, containers, want] = fields::<4>(row);
        let pod = kpod("", init, containers);
        let want = flag(want);
        let name = format!("TestAllContainersCouldRestart/{case}");
        let label = name.clone();
        out.push((
            name,
            Box::new(move || {
                let spec = pod.spec.as_ref().expect("a spec");
                assert_eq!(all_containers_could_restart(spec), want, "{label}");
            }),
        ));
    }
    for row in ALL_RESTART_ROWS {
        let [case, init, containers, runtime, marked, want] = fields::<6>(row);
        let pod = kpod("", init, containers);
        let v = view(kruntime(runtime));
        let api = flag(marked).then(|| PodStatus {
            conditions: Some(vec![PodCondition {
                type_: "AllContainersRestarting".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        let want = flag(want);
        let name = format!("TestShouldAllContainersRestart/{case}");
        let label = name.clone();
        out.push((
            name,
            Box::new(move || {
                let got = should_all_containers_restart(&pod, &v, api.as_ref());
                assert_eq!(got, want, "{label}");
            }),
        ));
    }
    for row in ALL_RESTARTING_ROWS {
        let [case, runtime, marked, phase, status, reason, message] = fields::<7>(row);
        let pod = kpod("", "", "container1,trigger@Never!42");
        let v = view(kruntime(runtime));
        let old = flag(marked).then(|| PodStatus {
            conditions: Some(vec![PodCondition {
                type_: "AllContainersRestarting".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        let (phase, want) = (
            phase.to_string(),
            [status, reason, message].map(String::from),
        );
        let name = format!("TestGenerateAllContainersRestartingCondition/{case}");
        let label = name.clone();
        out.push((
            name,
            Box::new(move || {
                let c = all_containers_restarting_condition(&pod, &v, old.as_ref(), &phase);
                assert_eq!(c.type_, "AllContainersRestarting", "{label}");
                assert_eq!(csum(&c), want, "{label}");
                // kubelet's whole condition: no generation, no times of its own.
                assert_eq!(
                    (
                        c.observed_generation,
                        c.last_transition_time,
                        c.last_probe_time
                    ),
                    (None, None, None),
                    "{label}"
                );
            }),
        ));
    }
    for row in BE_RESTARTED_ROWS {
        let [policy, deleted, want] = fields::<3>(row);
        let mut pod = kpod(policy, "", "no-history,alive,succeed,failed,unknown");
        if flag(deleted) {
            pod = self::deleted(pod);
        }
        let v = view(kruntime(
            "alive:R succeed:T0 failed:T1 alive:T2 unknown:U failed:T3",
        ));
        let want: Vec<bool> = want.split_whitespace().map(flag).collect();
        let name = if flag(deleted) {
            format!("TestShouldContainerBeRestarted/deleted pod/{policy}")
        } else {
            format!("TestShouldContainerBeRestarted/{policy}")
        };
        let label = name.clone();
        out.push((
            name,
            Box::new(move || {
                let conv = Convert {
                    pod: &pod,
                    view: &v,
                    runtime: "containerd",
                    reasons: &Reasons(&[]),
                    pod_restarting: false,
                };
                let spec = pod.spec.as_ref().expect("a spec");
                let got: Vec<bool> = spec
                    .containers
                    .iter()
                    .map(|c| conv.should_be_restarted(c))
                    .collect();
                assert_eq!(got, want, "{label}");
            }),
        ));
    }
    for row in POD_ACTION_ROWS {
        let [case, policy, containers, runtime, started] = fields::<5>(row);
        let pod = kpod(policy, "", containers);
        let v = view(kruntime(runtime));
        let started: Vec<String> = started.split_whitespace().map(String::from).collect();
        let name = format!("TestComputePodActionsWithContainerRestartRules/{case}");
        let label = name.clone();
        out.push((
            name,
            Box::new(move || {
                const LOOPING: &[(&str, &str)] = &[
                    ("foo1", "CrashLoopBackOff"),
                    ("foo2", "CrashLoopBackOff"),
                    ("foo3", "CrashLoopBackOff"),
                ];
                let conv = Convert {
                    pod: &pod,
                    view: &v,
                    runtime: "containerd",
                    reasons: &Reasons(LOOPING),
                    pod_restarting: false,
                };
                let spec = pod.spec.as_ref().expect("a spec");
                let statuses = conv.statuses(&spec.containers, &[], false, false);
                for c in &spec.containers {
                    let inst = conv.instances(&c.name);
                    let stopped = inst.first().is_none_or(|i| i.phase != Running);
                    let again = started.contains(&c.name);
                    if stopped {
                        assert_eq!(conv.should_be_restarted(c), again, "{label}: {}", c.name);
                    }
                    let s = statuses
                        .iter()
                        .find(|s| s.name == c.name)
                        .expect("a status");
                    let waits = describe(s.state.as_ref()) == "waiting:CrashLoopBackOff";
                    assert_eq!(waits, again, "{label}: {} {:?}", c.name, s.state);
                    // Waiting out the back-off, the termination is the last state.
                    if again
                        && inst
                            .first()
                            .is_some_and(|i| i.phase == ContainerPhase::Exited)
                    {
                        let last = describe(s.last_state.as_ref());
                        assert!(last.starts_with("terminated:"), "{label}: {last}");
                    }
                }
            }),
        ));
    }
    for row in BACKOFF_ROWS {
        let [case, runtime, want] = fields::<3>(row);
        let v = view(kruntime(runtime));
        let now = v.containers[0].finished_at.unwrap_or(t(100));
        let name = format!("TestDoBackOff/{case}");
        let label = name.clone();
        out.push((
            name,
            Box::new(move || {
                let reasons = BackOff::new(&v, now, None);
                let got = reasons.get("foocontainer");
                match want {
                    "-" => assert_eq!(got, None, "{label}"),
                    reason => {
                        let (r, m) = got.unwrap_or_else(|| panic!("{label}: no reason"));
                        assert_eq!(r, reason, "{label}");
                        let m = m.unwrap_or_default();
                        assert!(
                            m.starts_with("back-off 10s restarting failed container=foocontainer pod=web_default("),
                            "{label}: {m}"
                        );
                    }
                }
            }),
        ));
    }
    // The status's and a condition's observedGeneration (podutil's Calculate*ObservedGeneration,
    // api/v1/pod/util_test.go), through the whole computation: the pod's generation 5.
    let generation_case = |observed: Option<i64>, on_condition: bool| {
        move || {
            let mut pod = kpod("Always", "", "app");
            pod.metadata.generation = Some(5);
            let mut status = PodStatus::default();
            if on_condition {
                status.conditions = Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: "False".into(),
                    observed_generation: observed,
                    ..Default::default()
                }]);
            } else {
                status.observed_generation = observed;
            }
            pod.status = Some(status);
            let types = ConditionTypes::default();
            let out = compute_status(&StatusInputs {
                pod: Some(&pod),
                view: &view(vec![cv("app", 0, Running)]),
                previous: None,
                now: t(100),
                runtime: "containerd",
                types: &types,
            });
            assert_eq!(out.status.observed_generation, Some(5));
            let ready = cond(&out.status, "Ready").expect("Ready");
            assert_eq!(ready.observed_generation, Some(5));
        }
    };
    for (case, observed) in [
        (
            "pod with no observedGeneration/PodObservedGenerationTracking=true",
            None,
        ),
        (
            "pod with observedGeneration/PodObservedGenerationTracking=true",
            Some(5),
        ),
    ] {
        out.push((
            format!("TestCalculatePodStatusObservedGeneration/{case}"),
            Box::new(generation_case(observed, false)),
        ));
        out.push((
            format!("TestCalculatePodConditionObservedGeneration/{case}"),
            Box::new(generation_case(observed, true)),
        ));
    }
    // status/status_manager_test.go: a change of any field kubelet owns is a change (the agent's
    // dedup compares the whole normalised status: every field is owned).
    out.push((
        "TestIsPodStatusByKubeletEqualFutureProof/owned fields are not ignored".into(),
        Box::new(|| {
            use crate::status::patch::same_status;
            use k8s_openapi::api::core::v1::{HostIP, PodIP, ResourceRequirements};
            use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
            let base = status_of("Running", &["app:R"]);
            let cpu = || Some([("cpu".to_string(), Quantity("100m".into()))].into());
            let changes: [FieldChange; 17] = [
                ("Phase", |s| s.phase = Some("Succeeded".into())),
                ("Conditions", |s| {
                    s.conditions = Some(vec![PodCondition {
                        type_: "Ready".into(),
                        status: "True".into(),
                        ..Default::default()
                    }])
                }),
                ("Message", |s| s.message = Some("test message".into())),
                ("Reason", |s| s.reason = Some("TestReason".into())),
                ("NominatedNodeName", |s| {
                    s.nominated_node_name = Some("test-node".into())
                }),
                ("HostIP", |s| s.host_ip = Some("192.168.1.1".into())),
                ("HostIPs", |s| {
                    s.host_ips = Some(vec![HostIP {
                        ip: "192.168.1.1".into(),
                    }])
                }),
                ("PodIP", |s| s.pod_ip = Some("1.2.3.4".into())),
                ("PodIPs", |s| {
                    s.pod_ips = Some(vec![PodIP {
                        ip: "1.2.3.5".into(),
                    }])
                }),
                ("StartTime", |s| s.start_time = Some(to_time(t(7)))),
                ("InitContainerStatuses", |s| {
                    s.init_container_statuses = Some(vec![kstatus("init-container:R")])
                }),
                ("ContainerStatuses", |s| {
                    s.container_statuses = Some(vec![kstatus("container:R")])
                }),
                ("QOSClass", |s| s.qos_class = Some("Guaranteed".into())),
                ("EphemeralContainerStatuses", |s| {
                    s.ephemeral_container_statuses = Some(vec![kstatus("ephemeral-container:R")])
                }),
                ("Resize", |s| s.resize = Some("InProgress".into())),
                ("ObservedGeneration", |s| s.observed_generation = Some(1)),
                ("Resources", |s| {
                    s.resources = Some(ResourceRequirements {
                        requests: Some([("cpu".to_string(), Quantity("100m".into()))].into()),
                        ..Default::default()
                    })
                }),
            ];
            for (field, change) in changes {
                let mut modified = base.clone();
                change(&mut modified);
                assert!(!same_status(&base, &modified), "{field}: change ignored");
            }
            let mut modified = base.clone();
            modified.allocated_resources = cpu();
            assert!(
                !same_status(&base, &modified),
                "AllocatedResources: change ignored"
            );
        }),
    ));
    out
}

/// kubelet cases kept out, each with why. Where a whole table is out, its name stands for all
/// its rows (their count in brackets).
const LEFT_OUT: &[(&str, &str)] = &[
    ("TestConvertToAPIContainerStatusesWithImageVolumeDigest [2]", "cannot know: image digests come from the runtime's image service, not in the view"),
    ("TestConvertToAPIContainerStatusesForResources [16]", "cannot know: container resources are kubelet's allocation and CRI's ContainerResources; full mode keeps the API's"),
    ("TestConvertToAPIContainerStatusesForUser [6]", "cannot know: the container's user is in CRI's status, not in the view; full mode keeps the API's"),
    ("Test_generateAPIPodStatus/current status ready, with previous statuses and deletion, InPlacePodLevelResourcesVerticalScaling enabled",
     "cannot know: pod-level resources (kubelet's allocation, pod cgroup); the rest is the case without the gate"),
    ("Test_generateAPIPodStatus/current status ready, with previous statuses and no deletion, InPlacePodLevelResourcesVerticalScaling enabled",
     "cannot know: pod-level resources; the rest is the case without the gate"),
    ("Test_generateAPIPodStatus/InPlacePodLevelResourcesVerticalScaling enabled, only CPU set", "cannot know: resources and QoS class only (the QoS class is kept from the API)"),
    ("Test_generateAPIPodStatus/InPlacePodLevelResourcesVerticalScaling enabled, only Memory set", "cannot know: resources and QoS class only"),
    ("Test_generateAPIPodStatus/InPlacePodLevelResourcesVerticalScaling enabled, 0 values for CPU and Memory", "cannot know: resources and QoS class only"),
    ("TestConvertToAPIPodLevelResourcesStatus [2]", "cannot know: the pod cgroup's configuration"),
    ("Test_generateAPIPodStatusForInPlaceVPAEnabled [2]", "cannot know: resize conditions are kubelet's status manager's; kept from the API"),
    ("TestGenerateAPIPodStatusHostNetworkPodIPs [8]", "cannot know: pod IPs come from the sandbox's network status and the node's addresses; kept from the API"),
    ("TestNodeAddressUpdatesGenerateAPIPodStatusHostNetworkPodIPs [6]", "cannot know: pod IPs; kept from the API"),
    ("TestGenerateAPIPodStatusPodIPs [11]", "cannot know: pod IPs; kept from the API"),
    ("TestSortPodIPs [12]", "cannot know: pod IPs; kept from the API"),
    // Restart rules, RestartAllContainers, observedGeneration and stop signals (1.37.2).
    ("TestComputePodActionsForRestartAllContainers [10]", "kuberuntime/kuberuntime_manager_test.go: which containers kubelet kills and removes; the agent reports status, the resulting removals reach it as the runtime's (TestConvertToAPIContainerStatuses' RestartAllContainers cases)"),
    ("TestSyncPodWithRestartAllContainers [1]", "kuberuntime/kuberuntime_manager_test.go: kubelet's SyncPod against a fake runtime"),
    ("TestIsContainerRestartable [8]", "api/v1/pod/util_test.go: podutil.IsContainerRestartable decides kubelet's pod cgroup after its own restart, no status"),
    ("TestIsPodStatusByKubeletEqualFutureProof/ignored fields are ignored", "status/status_manager_test.go: the agent's dedup compares its whole desired status (the resource claims copied from the API); a change there is a recompute whose patch names none of them (patch::COMPUTED_KEYS)"),
    ("TestPodResizeConditions [10]", "status/status_manager_test.go: the resize conditions and their observedGeneration are kubelet's status manager's; kept from the API"),
    ("TestClearPodResizeInProgressCondition [2]", "status/status_manager_test.go: kubelet's status manager's state"),
    ("TestBackfillPodResizeConditions [1]", "status/status_manager_test.go: kubelet's status manager's state"),
    ("TestDoProbeWithContainerRestartRules [8]", "prober/worker_test.go: whether kubelet's prober keeps probing a stopped container; probe results are kubelet's (Unknown::Readiness, Unknown::Startup)"),
    ("TestDoProbeWithContainerRestartAllContainers [3]", "prober/worker_test.go: kubelet's prober, as above"),
    ("TestSyncPodRestartAllContainersRequeue [1]", "kubelet_test.go: kubelet's pod worker requeues a pod it reset"),
    ("TestSyncPodWithErrorsDuringInPlacePodResize [4]", "kubelet_test.go: the resize conditions (their observedGeneration) and Events are kubelet's status manager's; kept from the API"),
    ("TestGenerateContainerConfig [1]", "kuberuntime/kuberuntime_container_linux_test.go: the container's CRI config (its stop signal among it); status.stopSignal is the runtime's report, kept from the API for the same instance"),
];

/// The parts of pinned cases not compared, each with why (the rest of each case is).
const NOT_COMPARED: &[(&str, &str)] = &[
    (
        "TestConvertToAPIContainerStatuses/*: a terminated reason kubelet's fake runtime leaves empty",
        "the agent's is the kernel's account of the exit (Completed, Error), never empty",
    ),
    (
        "TestComputePodActionsWithContainerRestartRules/*: kills, the sandbox's recreation and the running containers it restarts",
        "kubelet's actions; compared: which stopped containers kubelet starts again, and their waiting state",
    ),
    (
        "TestDoBackOff/*: the back-off's length",
        "the test's fake back-off starts at 1 s; compared with kubelet's own, 10 s (kubelet.go)",
    ),
    (
        "Test_generateAPIPodStatus/*: hostIP, hostIPs, qosClass, resources",
        "kept from the API (the node's addresses, QoS and resources are not the view's)",
    ),
    (
        "TestGeneratePodInitializedCondition/*: message",
        "kubelet's test checks type, status and reason only",
    ),
];

/// The number of named cases run here (229 kubelet cases, 7 of them twice: for regular and for
/// init containers, as kubelet runs them); a change to the tables must change it.
const PINNED: usize = 94 + 11 + 14 + 11 + 6 + 5 + 2 * (4 + 3) + 1 + 14 + 1 + 8 + 5 + RESTART_CASES;

/// `restart_rows`: ContainerShouldRestart 13, FindMatchingContainerRestartRule 5,
/// AllContainersCouldRestart 4, ShouldAllContainersRestart 5,
/// GenerateAllContainersRestartingCondition 6, ShouldContainerBeRestarted 6,
/// ComputePodActionsWithContainerRestartRules 5, DoBackOff 3, the two observedGeneration
/// tests 2 + 2, IsPodStatusByKubeletEqualFutureProof 1.
const RESTART_CASES: usize = 13 + 5 + 4 + 5 + 6 + 6 + 5 + 3 + 4 + 1;

#[test]
fn kubelet_cases() {
    let mut failed: Vec<String> = Vec::new();
    let mut names: Vec<String> = Vec::new();
    let mut check = |name: String, f: &dyn Fn()| {
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err() {
            failed.push(name.clone());
        }
        names.push(name);
    };
    for (name, f) in phase_rows() {
        check(name, &*f);
    }
    for (name, f) in restart_rows() {
        check(name, &*f);
    }
    for row in CONTAINERS_READY_ROWS {
        let name = format!(
            "TestGenerateContainersReadyCondition/{}",
            fields::<10>(row)[0]
        );
        check(name.clone(), &|| {
            let i = ready_inputs(row);
            let c = containers_ready_condition(&i.pod, i.statuses.as_deref(), &i.phase);
            assert_eq!(c.type_, "ContainersReady");
            assert_eq!(csum(&c), i.want, "{name}");
        });
    }
    for row in POD_READY_ROWS {
        let name = format!("TestGeneratePodReadyCondition/{}", fields::<10>(row)[0]);
        check(name.clone(), &|| {
            let i = ready_inputs(row);
            let c = pod_ready_condition(&i.pod, &i.conditions, i.statuses.as_deref(), &i.phase);
            assert_eq!(c.type_, "Ready");
            assert_eq!(csum(&c), i.want, "{name}");
        });
    }
    for row in INITIALIZED_ROWS {
        let [case, init, containers, statuses, phase, s, r] = fields::<7>(row);
        let name = format!("TestGeneratePodInitializedCondition/{case}");
        check(name.clone(), &|| {
            let pod = kpod("Always", init, containers);
            let old = PodStatus::default();
            let c = initialized_condition(&pod, &old, kstatuses(statuses).as_deref(), phase);
            assert_eq!(c.type_, "Initialized");
            let [status, reason, _] = csum(&c);
            assert_eq!([status.as_str(), reason.as_str()], [s, r], "{name}");
        });
    }
    for row in SANDBOX_ROWS {
        let [case, host, sandboxes, status, reason, message] = fields::<6>(row);
        let name = format!("TestGeneratePodReadyToStartContainersCondition/{case}");
        check(name.clone(), &|| {
            let mut pod = kpod("Always", "", "");
            if let Some(spec) = pod.spec.as_mut() {
                spec.host_network = Some(flag(host));
            }
            let c = ready_to_start_containers_condition(&pod, &ksandboxes(sandboxes));
            assert_eq!(c.type_, "PodReadyToStartContainers", "{name}");
            assert_eq!(csum(&c), [status, reason, message], "{name}");
        });
    }
    for case in convert_cases() {
        check(case.name.clone(), &|| run_convert(&case));
    }
    for case in generate_cases() {
        check(format!("Test_generateAPIPodStatus/{}", case.name), &|| {
            run_generate(&case)
        });
    }
    check(
        "TestConvertToAPIContainerStatusesDataRace/(single)".into(),
        &|| {
            // Two threads compute from the same inputs: the computation only reads them.
            let pod = kpod("Always", "", "A,B");
            let v = view(vec![cv("A", 0, Running), cv("B", 1, Running)]);
            let types = ConditionTypes::default();
            let inputs = StatusInputs {
                pod: Some(&pod),
                view: &v,
                previous: None,
                now: t(100),
                runtime: "containerd",
                types: &types,
            };
            let (a, b) = std::thread::scope(|s| {
                let a = s.spawn(|| compute_status(&inputs));
                let b = s.spawn(|| compute_status(&inputs));
                (a.join().expect("thread a"), b.join().expect("thread b"))
            });
            assert_eq!(a, b);
            assert_eq!(v, view(vec![cv("A", 0, Running), cv("B", 1, Running)]));
        },
    );
    let mut unique = names.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), names.len(), "case names are unique");
    for (part, why) in NOT_COMPARED {
        assert!(part.contains("/*") && !why.is_empty(), "{part}");
    }
    // The ledger: every row of kubelet's tables is pinned or left out with its reason.
    let left_out: usize = LEFT_OUT
        .iter()
        .map(|(out, _)| {
            out.rsplit_once(" [")
                .and_then(|(_, n)| n.strip_suffix(']')?.parse().ok())
                .unwrap_or(1)
        })
        .sum();
    assert_eq!(left_out, 120, "kubelet cases left out");
    for (out, why) in LEFT_OUT {
        assert!(!why.is_empty());
        assert!(
            !names.iter().any(|n| n == out),
            "{out} is both pinned and left out"
        );
    }
    assert_eq!(names.len(), PINNED, "kubelet cases pinned");
    assert!(failed.is_empty(), "failed kubelet cases: {failed:#?}");
}

/// The hand-made formatter gives what jiff and the API's `Time` give, over the years it
/// formats (leap days, centuries, the last second of 9999), and jiff's beyond.
#[test]
fn rfc3339_is_jiffs_and_the_apis() {
    use std::time::{Duration, UNIX_EPOCH};
    let mut secs: Vec<u64> = vec![
        0,
        59,
        86_399,
        951_782_400,     // 2000-02-29
        951_868_799,     // 2000-02-29T23:59:59
        4_107_542_400,   // 2100-03-01
        1_796_256_000,   // 2026-12-02
        253_402_207_200, // the last second jiff formats
    ];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..20_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        secs.push(x % 253_402_207_201);
    }
    for s in secs {
        let t = UNIX_EPOCH + Duration::from_secs(s) + Duration::from_nanos(s % 1_000_000_000);
        let jiff = Timestamp::from_second(s as i64).unwrap().to_string();
        assert_eq!(rfc3339(t), jiff, "second {s}");
        let api = serde_json::to_string(&to_time(t)).unwrap();
        assert_eq!(format!("\"{}\"", rfc3339(t)), api, "second {s}");
    }
    let last = UNIX_EPOCH + Duration::from_secs(253_402_300_799);
    assert_eq!(rfc3339(last), "9999-12-31T23:59:59Z");
}

/// A rule whose action this release does not know falls through to the container's own policy
/// (`podutil.ContainerShouldRestart`'s `default:`), never to "does not restart".
#[test]
fn an_unknown_rule_action_falls_through_to_the_containers_policy() {
    let s = spec("Never", vec![], vec![]);
    assert!(container_should_restart(
        &ruled("app", "Always", "SomethingNew", 1),
        &s,
        1
    ));
    assert!(!container_should_restart(
        &ruled("app", "Never", "SomethingNew", 1),
        &s,
        1
    ));
    assert!(container_should_restart(
        &ruled("app", "Never", "Restart", 1),
        &s,
        1
    ));
}

/// `observedGeneration` never goes below the last status's or the API's (kubelet's
/// `updateStatusInternal`), so a `full` patch never deletes it, even where the pod carries no
/// generation.
#[test]
fn observed_generation_never_goes_back_nor_away() {
    let mut p = kpod("Always", "", "app");
    p.metadata.generation = None;
    p.status = Some(PodStatus {
        observed_generation: Some(2),
        ..Default::default()
    });
    let previous = PodStatus::default();
    let out = compute_status(&StatusInputs {
        pod: Some(&p),
        view: &view(vec![cv("app", 0, Running)]),
        previous: Some(&previous),
        now: t(100),
        runtime: "containerd",
        types: &ConditionTypes::default(),
    });
    assert_eq!(out.status.observed_generation, Some(2));
    let api = p.status.as_ref().unwrap();
    let patch = crate::status::patch::status_patch("u", api, &out.status)
        .unwrap()
        .unwrap();
    assert!(
        patch["status"].get("observedGeneration").is_none(),
        "{patch}"
    );
}
