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
            name: "deleted_pod_with_every_container_stopped_is_terminal_even_under_always",
            pod: Some({
                let mut p = always(&["app"]);
                p.metadata.deletion_timestamp = Some(to_time(t(50)));
                p
            }),
            previous: None,
            view: view(vec![exited("app", 0, 0, "Completed")]),
            now: t(100),
            expect: Expect {
                phase: Some("Succeeded"),
                containers: &[("app", "terminated:Completed:0", 0, "-")],
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
                    assert!(w.message.as_deref().unwrap().starts_with("back-off 300s "));
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
                conditions: &[("PodReadyToStartContainers", "False", "")],
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
