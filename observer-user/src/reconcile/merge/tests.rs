//! The merge rules, one case per situation the kernel and the runtime can leave us in: watched
//! live (probes), or not (the agent started after, or restarted mid-way: only the runtime and the
//! kernel log).
use std::time::{Duration, SystemTime};

use super::*;
use crate::{
    kernel::{BootNs, Comm, OomMemory, Task, WaitStatus},
    pleg::{ContainerExit, PlegEvent, PodLifecycleEvent},
};

const INIT: u32 = 100;
const CHILD: u32 = 101;

fn id() -> ContainerId {
    ContainerId::parse(&"c0ffee".repeat(11)[..64]).unwrap()
}

fn status(state: api::ContainerState, exit_code: i32, reason: &str) -> api::ContainerStatus {
    let mut s = api::ContainerStatus {
        id: id().to_string(),
        metadata: Some(api::ContainerMetadata {
            name: "app".into(),
            attempt: 2,
        }),
        state: state as i32,
        // Started a minute ago, finished a second ago (when exited).
        created_at: ns_ago(61),
        started_at: ns_ago(60),
        finished_at: if state == api::ContainerState::ContainerExited {
            ns_ago(1)
        } else {
            0
        },
        exit_code,
        reason: reason.into(),
        ..Default::default()
    };
    s.labels
        .insert("io.kubernetes.container.name".into(), "app".into());
    s.annotations
        .insert("io.kubernetes.container.restartCount".into(), "2".into());
    s
}

fn ns_ago(secs: u64) -> i64 {
    (SystemTime::now() - Duration::from_secs(secs))
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64
}

fn exited(code: i32, reason: &str) -> api::ContainerStatus {
    status(api::ContainerState::ContainerExited, code, reason)
}

fn running() -> api::ContainerStatus {
    status(api::ContainerState::ContainerRunning, 0, "")
}

fn oom(pid: u32) -> Box<OomKill> {
    let task = Task {
        pid,
        tgid: pid,
        ppid: 1,
        ns_pid: 1,
        ns_level: 1,
        comm: Comm::from("hog"),
        cgroup_id: 9,
    };
    Box::new(OomKill {
        at: BootClock::now(),
        marked_at: BootClock::now(),
        victim: task,
        victim_comm: Comm::from("hog"),
        memory: OomMemory {
            anon_rss_kb: Some(31_000),
            ..Default::default()
        },
        oom_score_adj: Some(999),
        trigger_pid: pid,
        trigger_tgid: pid,
        trigger_cgroup_id: 9,
    })
}

fn died(status: Option<WaitStatus>, reason: ExitReason) -> Option<(BootNs, ContainerExit)> {
    Some((
        BootClock::now(),
        ContainerExit {
            status,
            reason,
            pid: Some(INIT),
            comm: Some(Comm::from("app")),
        },
    ))
}

fn kernel(exit: Option<(BootNs, ContainerExit)>, oom: Option<Box<OomKill>>) -> KernelEvidence {
    KernelEvidence {
        created: Some(BootNs(1)),
        started: Some((BootNs(2), INIT, Comm::from("app"))),
        oom_kills: u32::from(oom.is_some()),
        oom_victims: oom.iter().map(|o| (o.victim.tgid, o.marked_at)).collect(),
        init_kill: oom.clone().filter(|o| o.victim.tgid == INIT),
        last_oom: oom,
        last_oom_trigger: None,
        exit,
        removed: None,
    }
}

/// A kill in the kernel log, `secs_ago` seconds ago.
fn logged(pid: u32, secs_ago: u64) -> LoggedOomKill {
    LoggedOomKill {
        at_us: 1,
        time: SystemTime::now() - Duration::from_secs(secs_ago),
        pid,
        comm: "hog".into(),
        task_memcg: "/kubepods/burstable/podx/c".into(),
        oom_memcg: "/kubepods/burstable/podx".into(),
        anon_rss_kb: Some(20_000),
        ..Default::default()
    }
}

fn log_from(secs_ago: u64) -> Option<SystemTime> {
    Some(SystemTime::now() - Duration::from_secs(secs_ago))
}

fn view(i: Inputs<'_>) -> ContainerView {
    merge(i, &BootClock::new())
}

fn summary(v: &ContainerView) -> (ContainerPhase, Option<i32>, Option<&str>, Option<Source>) {
    (v.phase, v.exit_code, v.reason.as_deref(), v.exit_source)
}

fn runtime_said(v: &ContainerView) -> (Option<i32>, Option<&str>) {
    (v.runtime_exit_code, v.runtime_reason.as_deref())
}

#[test]
fn runtime_only() {
    let s = exited(3, "Error");
    let v = view(Inputs {
        runtime: Some(&s),
        ..Inputs::new(id())
    });
    assert_eq!(
        summary(&v),
        (
            ContainerPhase::Exited,
            Some(3),
            Some("Error"),
            Some(Source::Runtime)
        )
    );
    assert_eq!((v.name.as_str(), v.restart_count), ("app", 2));
    assert!(!v.kernel_seen);
    assert_eq!(runtime_said(&v), (None, None));
}

/// A start the runtime could not make: its message is kept (bounded), and the zero start time is
/// the epoch, as kubelet writes it.
#[test]
fn a_failed_start_keeps_the_runtimes_message_and_a_zero_start() {
    let mut s = exited(128, "StartError");
    s.started_at = 0;
    s.message = "failed to create containerd task: exec: \"/no/such/binary\": stat /no/such/binary: no such file or directory\n".into();
    let v = view(Inputs {
        runtime: Some(&s),
        ..Inputs::new(id())
    });
    assert_eq!(
        v.message.as_deref(),
        Some("failed to create containerd task: exec: \"/no/such/binary\": stat /no/such/binary: no such file or directory")
    );
    assert_eq!(v.started_at, Some(SystemTime::UNIX_EPOCH));
    // A message past kubelet's 4 KiB is cut, at a character.
    s.message = "é".repeat(3000);
    let v = view(Inputs {
        runtime: Some(&s),
        ..Inputs::new(id())
    });
    let m = v.message.unwrap();
    assert!(m.len() <= 4096 && m.len() >= 4094, "{}", m.len());
    assert!(m.chars().all(|c| c == 'é'));
    // A container that ran keeps its start.
    let v = view(Inputs {
        runtime: Some(&exited(3, "Error")),
        ..Inputs::new(id())
    });
    assert_ne!(v.started_at, Some(SystemTime::UNIX_EPOCH));
    assert_eq!(v.message, None);
}

/// The container's own termination message, read from the node, follows the runtime's as
/// kubelet joins them; one the agent could not read leaves the message incomplete (kubelet's
/// copy then stands).
#[test]
fn the_termination_message_read_from_the_node_completes_the_message() {
    use crate::reconcile::termination::TerminationMessage;
    let mut s = exited(2, "Error");
    let read = TerminationMessage::Read("wrote this\n".into());
    let v = view(Inputs {
        runtime: Some(&s),
        termination: Some(&read),
        ..Inputs::new(id())
    });
    assert_eq!(v.message.as_deref(), Some("wrote this\n"));
    assert!(v.message_complete);
    s.message = "runtime says".into();
    let v = view(Inputs {
        runtime: Some(&s),
        termination: Some(&read),
        ..Inputs::new(id())
    });
    assert_eq!(v.message.as_deref(), Some("runtime says: wrote this\n"));
    let unreadable = TerminationMessage::Unreadable("not mounted".into());
    let v = view(Inputs {
        runtime: Some(&s),
        termination: Some(&unreadable),
        ..Inputs::new(id())
    });
    assert_eq!(v.message.as_deref(), Some("runtime says"));
    assert!(!v.message_complete);
}

#[test]
fn kernel_death_wins_while_the_runtime_still_says_running() {
    let k = kernel(died(Some(WaitStatus::exited(3)), ExitReason::Error), None);
    let s = running();
    let v = view(Inputs {
        runtime: Some(&s),
        kernel: Some(&k),
        ..Inputs::new(id())
    });
    assert_eq!(
        summary(&v),
        (
            ContainerPhase::Exited,
            Some(3),
            Some("Error"),
            Some(Source::Kernel)
        )
    );
    assert!(v.finished_at.is_some());
    assert_eq!(
        runtime_said(&v),
        (None, None),
        "the runtime had not disagreed"
    );
}

#[test]
fn init_oom_kill_is_oomkilled_even_when_the_runtime_says_error_137() {
    let k = kernel(
        died(Some(WaitStatus::signaled(9, false)), ExitReason::OomKilled),
        Some(oom(INIT)),
    );
    let s = exited(137, "Error");
    let v = view(Inputs {
        runtime: Some(&s),
        kernel: Some(&k),
        ..Inputs::new(id())
    });
    assert_eq!(
        summary(&v),
        (
            ContainerPhase::Exited,
            Some(137),
            Some("OOMKilled"),
            Some(Source::Kernel)
        )
    );
    assert_eq!(v.signal, Some(9));
    assert_eq!(runtime_said(&v), (Some(137), Some("Error")));
    let o = v.last_oom.unwrap();
    assert_eq!(
        (o.init, o.pid, o.comm.as_str(), o.anon_rss_kb, o.source),
        (Some(true), INIT, "hog", Some(31_000), Source::Kernel)
    );
}

#[test]
fn child_oom_then_clean_exit_is_completed_with_the_kill_as_evidence() {
    let k = kernel(
        died(Some(WaitStatus::exited(0)), ExitReason::Completed),
        Some(oom(CHILD)),
    );
    let s = exited(0, "OOMKilled");
    let v = view(Inputs {
        runtime: Some(&s),
        kernel: Some(&k),
        ..Inputs::new(id())
    });
    assert_eq!(
        summary(&v),
        (
            ContainerPhase::Exited,
            Some(0),
            Some("Completed"),
            Some(Source::Kernel)
        )
    );
    assert_eq!(runtime_said(&v), (Some(0), Some("OOMKilled")));
    let o = v.last_oom.unwrap();
    assert_eq!((o.init, o.pid), (Some(false), CHILD));
    assert_eq!(v.oom_kills, 1);
}

#[test]
fn child_oom_in_a_running_container_stays_running() {
    let k = kernel(None, Some(oom(CHILD)));
    let s = running();
    let v = view(Inputs {
        runtime: Some(&s),
        kernel: Some(&k),
        ..Inputs::new(id())
    });
    assert_eq!(
        (v.phase, v.oom_kills, v.init_pid),
        (ContainerPhase::Running, 1, Some(INIT))
    );
    assert_eq!((v.reason, v.exit_source), (None, None));
}

#[test]
fn lost_exit_defers_to_the_runtime_or_is_unknown() {
    let k = kernel(died(None, ExitReason::Unknown), None);
    let s = exited(2, "Error");
    let v = view(Inputs {
        runtime: Some(&s),
        kernel: Some(&k),
        ..Inputs::new(id())
    });
    assert_eq!(
        summary(&v),
        (
            ContainerPhase::Exited,
            Some(2),
            Some("Error"),
            Some(Source::Runtime)
        )
    );
    let s = running();
    let v = view(Inputs {
        runtime: Some(&s),
        kernel: Some(&k),
        ..Inputs::new(id())
    });
    assert_eq!(
        summary(&v),
        (
            ContainerPhase::Exited,
            Some(137),
            Some("ContainerStatusUnknown"),
            Some(Source::Kernel)
        )
    );
}

#[test]
fn kernel_start_before_the_runtime_reports_it() {
    let k = kernel(None, None);
    let s = status(api::ContainerState::ContainerCreated, 0, "");
    let v = view(Inputs {
        runtime: Some(&s),
        kernel: Some(&k),
        ..Inputs::new(id())
    });
    assert_eq!((v.phase, v.init_pid), (ContainerPhase::Running, Some(INIT)));
    let v = view(Inputs {
        kernel: Some(&k),
        ..Inputs::new(id())
    });
    assert_eq!(v.phase, ContainerPhase::Running);
}

// Deaths the agent did not watch: it started after them, or was restarted across them.

#[test]
fn unwatched_oomkilled_exit_0_is_completed_not_the_runtimes_mislabel() {
    let s = exited(0, "OOMKilled");
    let v = view(Inputs {
        runtime: Some(&s),
        ..Inputs::new(id())
    });
    assert_eq!(
        summary(&v),
        (
            ContainerPhase::Exited,
            Some(0),
            Some("Completed"),
            Some(Source::Runtime)
        )
    );
    assert_eq!(runtime_said(&v), (Some(0), Some("OOMKilled")));
    assert_eq!(v.last_oom, None, "no kernel log: no evidence invented");
}

#[test]
fn unwatched_oomkilled_exit_0_shows_the_childs_kill_from_the_kernel_log() {
    let s = exited(0, "OOMKilled");
    let log = [logged(CHILD, 30)];
    let v = view(Inputs {
        runtime: Some(&s),
        runtime_pid: Some(INIT),
        logged: &log,
        log_since: log_from(3600),
        ..Inputs::new(id())
    });
    assert_eq!(
        summary(&v),
        (
            ContainerPhase::Exited,
            Some(0),
            Some("Completed"),
            Some(Source::Runtime)
        )
    );
    let o = v.last_oom.expect("the kill from the log");
    assert_eq!(
        (o.pid, o.init, o.source),
        (CHILD, Some(false), Source::KernelLog)
    );
    assert_eq!(
        o.oom_cgroup.as_deref(),
        Some("/kubepods/burstable/podx"),
        "the pod's limit was hit"
    );
    assert_eq!(v.oom_kills, 1);
}

#[test]
fn unwatched_oomkilled_with_another_code_is_error() {
    let s = exited(2, "OOMKilled");
    let v = view(Inputs {
        runtime: Some(&s),
        ..Inputs::new(id())
    });
    assert_eq!(
        summary(&v),
        (
            ContainerPhase::Exited,
            Some(2),
            Some("Error"),
            Some(Source::Runtime)
        )
    );
    assert_eq!(runtime_said(&v), (Some(2), Some("OOMKilled")));
}

#[test]
fn unwatched_error_137_whose_init_the_log_shows_killed_is_oomkilled() {
    let s = exited(137, "Error");
    let log = [logged(INIT, 10)];
    let v = view(Inputs {
        runtime: Some(&s),
        runtime_pid: Some(INIT),
        logged: &log,
        log_since: log_from(3600),
        ..Inputs::new(id())
    });
    assert_eq!(
        summary(&v),
        (
            ContainerPhase::Exited,
            Some(137),
            Some("OOMKilled"),
            Some(Source::KernelLog)
        )
    );
    assert_eq!(runtime_said(&v), (Some(137), Some("Error")));
    assert_eq!(v.last_oom.unwrap().init, Some(true));
}

#[test]
fn unwatched_error_137_with_only_a_childs_kill_stays_error() {
    let s = exited(137, "Error");
    let log = [logged(CHILD, 10)];
    let v = view(Inputs {
        runtime: Some(&s),
        runtime_pid: Some(INIT),
        logged: &log,
        log_since: log_from(3600),
        ..Inputs::new(id())
    });
    assert_eq!(
        summary(&v),
        (
            ContainerPhase::Exited,
            Some(137),
            Some("Error"),
            Some(Source::Runtime)
        )
    );
    assert_eq!(runtime_said(&v), (None, None));
    assert_eq!(v.last_oom.unwrap().init, Some(false));
}

#[test]
fn unwatched_oomkilled_137_is_error_when_the_whole_log_never_names_the_init() {
    // containerd 2.0-2.2 say OOMKilled on any OOM event in the cgroup: here a child's, then the
    // init was SIGKILLed from outside. The log covers the container's life and names only the child.
    let s = exited(137, "OOMKilled");
    let log = [logged(CHILD, 10)];
    let v = view(Inputs {
        runtime: Some(&s),
        runtime_pid: Some(INIT),
        logged: &log,
        log_since: log_from(3600),
        ..Inputs::new(id())
    });
    assert_eq!(
        summary(&v),
        (
            ContainerPhase::Exited,
            Some(137),
            Some("Error"),
            Some(Source::KernelLog)
        )
    );
    assert_eq!(runtime_said(&v), (Some(137), Some("OOMKilled")));
}

#[test]
fn unwatched_oomkilled_137_stays_when_the_log_rotated_past_the_start() {
    let s = exited(137, "OOMKilled");
    let v = view(Inputs {
        runtime: Some(&s),
        runtime_pid: Some(INIT),
        log_since: log_from(5),
        ..Inputs::new(id())
    });
    assert_eq!(
        summary(&v),
        (
            ContainerPhase::Exited,
            Some(137),
            Some("OOMKilled"),
            Some(Source::Runtime)
        )
    );
    assert_eq!(runtime_said(&v), (None, None));
}

#[test]
fn unwatched_oomkilled_137_stays_when_the_init_is_unknown() {
    let s = exited(137, "OOMKilled");
    let log = [logged(CHILD, 10)];
    let v = view(Inputs {
        runtime: Some(&s),
        logged: &log,
        log_since: log_from(3600),
        ..Inputs::new(id())
    });
    assert_eq!(
        summary(&v),
        (
            ContainerPhase::Exited,
            Some(137),
            Some("OOMKilled"),
            Some(Source::Runtime)
        )
    );
    assert_eq!(
        v.last_oom.unwrap().init,
        None,
        "whether the victim was the init is not known"
    );
}

#[test]
fn unwatched_child_kill_under_an_init_that_exited_0_is_no_init_kill_even_without_its_pid() {
    let s = exited(0, "OOMKilled");
    let log = [logged(CHILD, 30)];
    let v = view(Inputs {
        runtime: Some(&s),
        logged: &log,
        log_since: log_from(3600),
        ..Inputs::new(id())
    });
    assert_eq!(v.reason.as_deref(), Some("Completed"));
    assert_eq!(
        v.last_oom.unwrap().init,
        Some(false),
        "a killed init dies of SIGKILL, not exit 0"
    );
}

#[test]
fn unwatched_group_kill_is_the_containers_oom_kill() {
    // cgroup v2, memory.oom.group=1: the whole container was killed; the runtime says Error/137.
    let s = exited(137, "Error");
    let mut a = logged(CHILD, 10);
    a.group = true;
    let mut b = logged(CHILD + 1, 10);
    b.group = true;
    let log = [a, b];
    let v = view(Inputs {
        runtime: Some(&s),
        logged: &log,
        log_since: log_from(3600),
        ..Inputs::new(id())
    });
    assert_eq!(
        summary(&v),
        (
            ContainerPhase::Exited,
            Some(137),
            Some("OOMKilled"),
            Some(Source::KernelLog)
        )
    );
    let o = v.last_oom.unwrap();
    assert!(o.group);
    assert_eq!(v.oom_kills, 2);
}

#[test]
fn a_victim_that_exits_seconds_after_the_kill_is_the_logs_kill() {
    // 2 GiB to free: the probes report the kill at the victim's exit, 5 s after the OOM killer
    // chose it, which is when the log wrote its report.
    let mut kill = oom(CHILD);
    kill.at = BootNs(kill.marked_at.0 + 5_000_000_000);
    let clock = BootClock::new();
    let mut log = logged(CHILD, 0);
    log.time = clock.to_system_time(kill.marked_at);
    let k = kernel(None, Some(kill));
    let s = running();
    let v = merge(
        Inputs {
            runtime: Some(&s),
            kernel: Some(&k),
            logged: std::slice::from_ref(&log),
            log_since: log_from(3600),
            ..Inputs::new(id())
        },
        &clock,
    );
    assert_eq!(v.oom_kills, 1, "one kill, seen by both");
    let o = v.last_oom.unwrap();
    // The log's account (the cgroup that ran out) joined the probes'.
    assert_eq!(
        (o.source, o.oom_cgroup.as_deref()),
        (Source::Kernel, Some(log.oom_memcg.as_str())),
        "{o:?}"
    );
}

#[test]
fn a_kill_both_the_probes_and_the_log_saw_counts_once() {
    let kill = oom(CHILD);
    let clock = BootClock::new();
    let mut log = logged(CHILD, 0);
    log.time = clock.to_system_time(kill.at);
    let k = kernel(None, Some(kill));
    let s = running();
    let v = merge(
        Inputs {
            runtime: Some(&s),
            kernel: Some(&k),
            logged: std::slice::from_ref(&log),
            log_since: log_from(3600),
            ..Inputs::new(id())
        },
        &clock,
    );
    assert_eq!(v.oom_kills, 1);
    assert_eq!(
        v.last_oom.unwrap().source,
        Source::Kernel,
        "the probes' account is richer"
    );
}

#[test]
fn a_logged_kill_newer_than_the_probes_last_is_shown() {
    let k = kernel(None, Some(oom(CHILD)));
    let later = logged(CHILD + 1, 0);
    let mut later = later;
    later.time = SystemTime::now() + Duration::from_secs(5);
    let s = running();
    let v = view(Inputs {
        runtime: Some(&s),
        kernel: Some(&k),
        logged: std::slice::from_ref(&later),
        ..Inputs::new(id())
    });
    assert_eq!(v.oom_kills, 2);
    let o = v.last_oom.unwrap();
    assert_eq!((o.pid, o.source), (CHILD + 1, Source::KernelLog));
}

/// The scope is read relative to the container the kill is attributed to: a refused report says
/// so, and an `oom_memcg` shaped like another container's or pod's is no scope of this one.
#[test]
fn the_scope_of_a_logged_kill_is_relative_to_its_container() {
    use crate::kernel::oom_report::{Constraint, OomReport};
    let id = id();
    let pod = "/kubepods/burstable/pod0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0";
    let ctr = format!("{pod}/{}", id.as_str());
    let with = |oom: &str, task: &str, refused: bool| LoggedOomKill {
        oom_memcg: oom.into(),
        task_memcg: task.into(),
        report: Some(std::sync::Arc::new(OomReport {
            constraint: (!refused).then_some(Constraint::Memcg),
            refused,
            ..Default::default()
        })),
        ..logged(CHILD, 0)
    };
    let nested = format!("{ctr}/sub");
    assert_eq!(
        scope_of(&with(&ctr, &nested, false), id),
        OomScope::Container
    );
    assert_eq!(scope_of(&with(pod, &ctr, false), id), OomScope::Pod);
    assert_eq!(
        scope_of(&with("", "", true), id),
        OomScope::Unknown(ScopeUnknown::ReportRefused)
    );
    // Another container's cgroup, or one that does not hold the victim's: a cgroup, no more.
    let other = format!("{pod}/{}", "ab".repeat(32));
    assert_eq!(
        scope_of(&with(&other, &nested, false), id),
        OomScope::Cgroup(other.clone())
    );
    let elsewhere = "/kubepods/burstable/pod11111111-2222-4333-8444-555555555555";
    assert_eq!(
        scope_of(&with(elsewhere, &ctr, false), id),
        OomScope::Cgroup(elsewhere.into())
    );
}

/// The kernel signals an OOM victim before it marks it, so an init that exits at once is read
/// before its kill: the evidence folds the kill in afterwards and the view says OOMKilled.
#[test]
fn a_kill_read_after_the_death_it_caused_is_the_deaths_reason() {
    // The init's SIGKILL read first, then the kill of `victim`; the runtime says Error.
    let late_kill = |victim: u32| {
        let ev = |event| PodLifecycleEvent {
            pod_uid: crate::model::PodUid::parse("00000001-0000-4000-8000-000000000000").unwrap(),
            runtime: None,
            at: BootClock::now(),
            event,
        };
        let mut k = kernel(None, None);
        let (_, exit) = died(Some(WaitStatus::signaled(9, false)), ExitReason::Error).unwrap();
        k.apply(&ev(PlegEvent::ContainerDied { id: id(), exit }));
        k.apply(&ev(PlegEvent::OomKill {
            id: id(),
            kill: oom(victim),
            trigger: None,
        }));
        let s = exited(137, "Error");
        view(Inputs {
            runtime: Some(&s),
            kernel: Some(&k),
            ..Inputs::new(id())
        })
    };
    assert_eq!(
        summary(&late_kill(INIT)),
        (
            ContainerPhase::Exited,
            Some(137),
            Some("OOMKilled"),
            Some(Source::Kernel)
        )
    );
    // A child's kill after the init's SIGKILL is not the init's.
    assert_eq!(late_kill(CHILD).reason.as_deref(), Some("Error"));
}

/// A kill in the kernel log whose report says the OOM-ing cgroup was the container's own and
/// lists `tasks` processes, the victim `pid` first.
fn logged_with_dump(pid: u32, tasks: u32) -> LoggedOomKill {
    let cgroup = format!("/kubepods/burstable/pod{}/{}", "1".repeat(8), id());
    let dump = (0..tasks)
        .map(|n| crate::kernel::oom_report::Task {
            pid: pid + n,
            tgid: pid + n,
            name: "tail".into(),
            ..Default::default()
        })
        .collect();
    LoggedOomKill {
        task_memcg: cgroup.clone(),
        oom_memcg: cgroup,
        report: Some(std::sync::Arc::new(crate::kernel::oom_report::OomReport {
            tasks_listed: true,
            task_count: tasks,
            tasks: dump,
            constraint: Some(Constraint::Memcg),
            ..Default::default()
        })),
        ..logged(pid, 10)
    }
}

#[test]
fn unwatched_error_137_whose_report_lists_the_victim_alone_is_oomkilled() {
    // containerd's OOM event raced its exit event (it said Error/137); the init's pid is gone
    // with its exit. The kernel's report: the container's own limit, one process, the victim.
    let s = exited(137, "Error");
    let unwatched = |log: &[LoggedOomKill]| {
        view(Inputs {
            runtime: Some(&s),
            logged: log,
            log_since: log_from(3600),
            ..Inputs::new(id())
        })
    };
    let v = unwatched(&[logged_with_dump(CHILD, 1)]);
    assert_eq!(
        summary(&v),
        (
            ContainerPhase::Exited,
            Some(137),
            Some("OOMKilled"),
            Some(Source::KernelLog)
        )
    );
    assert_eq!(runtime_said(&v), (Some(137), Some("Error")));
    assert_eq!(v.last_oom.unwrap().init, Some(true));

    // Two processes in the dump: which one was the init is not known, and not guessed.
    let v = unwatched(&[logged_with_dump(CHILD, 2)]);
    assert_eq!(
        summary(&v),
        (
            ContainerPhase::Exited,
            Some(137),
            Some("Error"),
            Some(Source::Runtime)
        )
    );
    assert_eq!(v.last_oom.unwrap().init, None);
}

/// What the kernel saw of the init's end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seen {
    /// The probes saw its exit: a SIGKILL from the OOM killer, another SIGKILL, exit 0.
    OomKill,
    Sigkill,
    Exit0,
    /// The probes saw the container end, not how (its cgroup emptied).
    Lost,
    /// No agent ran then: the runtime and the kernel log are all there is.
    NotWatched,
}

/// The kernel's record of an OOM kill in the container (the probes' where they saw the exit,
/// else the kernel log's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Record {
    None,
    /// The init's pid as the victim, with the kernel's report, or without one (rate-limited).
    Init,
    InitNoReport,
    /// Another process of the container.
    Child,
    /// `memory.oom.group`: every process of the container, the init among them.
    Group,
    /// A victim the report lists as the container's only process.
    Alone,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Said {
    OomKilled137,
    Error137,
    OomKilled0,
    Completed0,
    Error2,
    /// containerd restarted after the task was gone: exit 255 `Unknown`.
    Lost255,
    Nothing,
}

#[derive(Clone, Copy, Debug)]
struct Combo {
    seen: Seen,
    record: Record,
    init_known: bool,
    /// The kernel log reaches back before the container started.
    log_covers: bool,
    said: Said,
}

/// Every combination of evidence that can occur together: the probes know the init wherever
/// they saw it end; a victim alone in its container is the init, so "alone" is a record only
/// where the init's pid is not known; a container nobody watched is known from its runtime.
fn combos() -> Vec<Combo> {
    use Record as R;
    use Said as S;
    use Seen as K;
    let mut all = Vec::new();
    for seen in [K::OomKill, K::Sigkill, K::Exit0, K::Lost, K::NotWatched] {
        for record in [
            R::None,
            R::Init,
            R::InitNoReport,
            R::Child,
            R::Group,
            R::Alone,
        ] {
            for init_known in [true, false] {
                for log_covers in [true, false] {
                    for said in [
                        S::OomKilled137,
                        S::Error137,
                        S::OomKilled0,
                        S::Completed0,
                        S::Error2,
                        S::Lost255,
                        S::Nothing,
                    ] {
                        let probes = matches!(seen, K::OomKill | K::Sigkill | K::Exit0);
                        let possible = match seen {
                            K::OomKill => record == R::Init,
                            K::Sigkill | K::Exit0 => matches!(record, R::None | R::Child),
                            K::Lost => true,
                            K::NotWatched => said != S::Nothing,
                        } && (!probes || (init_known && log_covers))
                            && !(record == R::Alone && init_known);
                        if possible {
                            all.push(Combo {
                                seen,
                                record,
                                init_known,
                                log_covers,
                                said,
                            });
                        }
                    }
                }
            }
        }
    }
    all
}

/// The merge's answer for one combination: reason, exit code, how it is known, and whether the
/// kill's victim was the init (yes / no / not known; `-` without a kill).
fn answer(c: &Combo) -> (String, &'static str, &'static str) {
    let s = match c.said {
        Said::OomKilled137 => Some(exited(137, "OOMKilled")),
        Said::Error137 => Some(exited(137, "Error")),
        Said::OomKilled0 => Some(exited(0, "OOMKilled")),
        Said::Completed0 => Some(exited(0, "Completed")),
        Said::Error2 => Some(exited(2, "Error")),
        Said::Lost255 => Some(exited(255, "Unknown")),
        Said::Nothing => None,
    };
    let exit = match c.seen {
        Seen::OomKill => died(
            Some(WaitStatus::signaled(9, false)),
            ExitReason::of(WaitStatus::signaled(9, false), true),
        ),
        Seen::Sigkill => died(
            Some(WaitStatus::signaled(9, false)),
            ExitReason::of(WaitStatus::signaled(9, false), false),
        ),
        Seen::Exit0 => died(
            Some(WaitStatus::exited(0)),
            ExitReason::of(WaitStatus::exited(0), false),
        ),
        Seen::Lost => died(None, ExitReason::Unknown),
        Seen::NotWatched => None,
    };
    let probes = exit.as_ref().is_some_and(|(_, e)| e.status.is_some());
    let victim = match c.record {
        Record::Init | Record::InitNoReport => INIT,
        _ => CHILD,
    };
    let probe_kill = (probes && c.record != Record::None).then(|| oom(victim));
    let mut k = (c.seen != Seen::NotWatched).then(|| kernel(exit, probe_kill));
    if let Some(k) = k.as_mut().filter(|_| !c.init_known) {
        k.started = None;
        if let Some((_, e)) = k.exit.as_mut() {
            e.pid = None;
        }
    }
    let logged_kills: Vec<LoggedOomKill> = match c.record {
        _ if probes => Vec::new(),
        Record::None => Vec::new(),
        Record::Init | Record::Child => vec![logged(victim, 10)],
        Record::InitNoReport => vec![LoggedOomKill {
            report: Some(std::sync::Arc::new(crate::kernel::oom_report::OomReport {
                not_printed: true,
                ..Default::default()
            })),
            ..logged(INIT, 10)
        }],
        Record::Group => [INIT, CHILD]
            .map(|pid| LoggedOomKill {
                group: true,
                ..logged(pid, 10)
            })
            .to_vec(),
        Record::Alone => vec![logged_with_dump(victim, 1)],
    };
    let v = view(Inputs {
        runtime: s.as_ref(),
        runtime_pid: (c.init_known && c.seen == Seen::NotWatched).then_some(INIT),
        kernel: k.as_ref(),
        logged: &logged_kills,
        log_since: log_from(if c.log_covers { 3600 } else { 5 }),
        ..Inputs::new(id())
    });
    let verdict = format!(
        "{} {}",
        v.reason.as_deref().unwrap_or("?"),
        v.exit_code.map_or("?".into(), |c| c.to_string())
    );
    let from = v.exit_source.map_or("?", |s| s.as_str());
    let init = match v.last_oom.as_ref().map(|o| o.init) {
        None => "-",
        Some(Some(true)) => "yes",
        Some(Some(false)) => "no",
        Some(None) => "not known",
    };
    (verdict, from, init)
}

/// One row of the table README.md gives ("How a death's reason is decided"): the
/// combinations it covers, in its own words, and the answer.
struct Row {
    kernel: &'static str,
    record: &'static str,
    runtime: &'static str,
    says: &'static str,
    from: &'static str,
    covers: fn(&Combo) -> bool,
}

fn proves_init(c: &Combo) -> bool {
    match c.record {
        Record::Init | Record::InitNoReport => c.init_known,
        Record::Group | Record::Alone => true,
        Record::None | Record::Child => false,
    }
}

fn watched(c: &Combo) -> bool {
    matches!(c.seen, Seen::OomKill | Seen::Sigkill | Seen::Exit0)
}

/// The rows, first match wins.
fn rule_table() -> Vec<Row> {
    use Said as S;
    vec![
        Row {
            kernel: "its exit: the OOM killer's SIGKILL",
            record: "the init's",
            runtime: "anything",
            says: "OOMKilled 137",
            from: "kernel",
            covers: |c| c.seen == Seen::OomKill,
        },
        Row {
            kernel: "its exit: another SIGKILL",
            record: "none, or another process's",
            runtime: "anything",
            says: "Error 137",
            from: "kernel",
            covers: |c| c.seen == Seen::Sigkill,
        },
        Row {
            kernel: "its exit: exit 0",
            record: "none, or another process's",
            runtime: "anything",
            says: "Completed 0",
            from: "kernel",
            covers: |c| c.seen == Seen::Exit0,
        },
        Row {
            kernel: "that it ended, not how",
            record: "proves the init's (below)",
            runtime: "nothing",
            says: "OOMKilled 137",
            from: "kernel-log",
            covers: |c| c.seen == Seen::Lost && c.said == S::Nothing && proves_init(c),
        },
        Row {
            kernel: "that it ended, not how",
            record: "anything else",
            runtime: "nothing",
            says: "ContainerStatusUnknown 137",
            from: "kernel",
            covers: |c| c.seen == Seen::Lost && c.said == S::Nothing,
        },
        Row {
            kernel: "not how it ended",
            record: "anything",
            runtime: "Completed 0, Error 2",
            says: "the runtime's",
            from: "runtime",
            covers: |c| !watched(c) && matches!(c.said, S::Completed0 | S::Error2),
        },
        Row {
            kernel: "not how it ended",
            record: "anything",
            runtime: "OOMKilled 0",
            says: "Completed 0",
            from: "runtime",
            covers: |c| !watched(c) && c.said == S::OomKilled0,
        },
        Row {
            kernel: "not how it ended",
            record: "proves the init's (below)",
            runtime: "OOMKilled 137, Error 137, Unknown 255",
            says: "OOMKilled 137",
            from: "kernel-log",
            covers: |c| {
                !watched(c)
                    && matches!(c.said, S::OomKilled137 | S::Error137 | S::Lost255)
                    && proves_init(c)
            },
        },
        Row {
            kernel: "not how it ended",
            record:
                "none, or another process's; the init's pid known, the log older than the container",
            runtime: "OOMKilled 137",
            says: "Error 137",
            from: "kernel-log",
            covers: |c| {
                !watched(c)
                    && c.said == S::OomKilled137
                    && c.init_known
                    && c.log_covers
                    && matches!(c.record, Record::None | Record::Child)
            },
        },
        Row {
            kernel: "not how it ended",
            record: "anything else",
            runtime: "OOMKilled 137, Error 137, Unknown 255",
            says: "the runtime's",
            from: "runtime",
            covers: |c| !watched(c) && matches!(c.said, S::OomKilled137 | S::Error137 | S::Lost255),
        },
    ]
}

/// The runtime's words for a combination, as the table's "the runtime's" means them.
fn runtime_words(s: Said) -> &'static str {
    match s {
        Said::OomKilled137 => "OOMKilled 137",
        Said::Error137 => "Error 137",
        Said::OomKilled0 => "OOMKilled 0",
        Said::Completed0 => "Completed 0",
        Said::Error2 => "Error 2",
        Said::Lost255 => "Unknown 255",
        Said::Nothing => "-",
    }
}

/// Whether the kill's victim was the init, as README.md says it is decided: yes where the
/// probes saw the OOM killer choose the init or the log names the init's pid; no where the init
/// outlived the kill (its exit was not a SIGKILL) or the pid is another than the known init's;
/// yes where the report lists the victim alone in its container; not known otherwise, a group
/// kill's victims included where the init's pid is not known.
fn init_words(c: &Combo, runtime_exit: Option<i32>) -> &'static str {
    if c.record == Record::None {
        return "-";
    }
    let init_survived = match c.seen {
        Seen::Exit0 => true,
        Seen::OomKill | Seen::Sigkill => false,
        Seen::Lost | Seen::NotWatched => runtime_exit.is_some_and(|e| e != 137),
    };
    match c.record {
        Record::Init | Record::InitNoReport | Record::Group if c.init_known => "yes",
        _ if init_survived => "no",
        Record::Alone => "yes",
        Record::Child if c.init_known => "no",
        _ => "not known",
    }
}

#[test]
fn every_combination_of_evidence_is_answered_as_the_readme_says() {
    let rows = rule_table();
    let mut used = vec![0usize; rows.len()];
    let mut wrong = Vec::new();
    let all = combos();
    for c in &all {
        let Some(n) = rows.iter().position(|r| (r.covers)(c)) else {
            wrong.push(format!("{c:?}: no row of the table covers it"));
            continue;
        };
        used[n] += 1;
        let r = &rows[n];
        let says = match r.says {
            "the runtime's" => runtime_words(c.said),
            s => s,
        };
        let (verdict, from, init) = answer(c);
        let runtime_exit = match c.said {
            Said::OomKilled137 | Said::Error137 => Some(137),
            Said::OomKilled0 | Said::Completed0 => Some(0),
            Said::Error2 => Some(2),
            // The runtime lost the exit: no word on whether the init outlived the kill.
            Said::Lost255 | Said::Nothing => None,
        };
        let expected_init = init_words(c, runtime_exit);
        if (verdict.as_str(), from, init) != (says, r.from, expected_init) {
            wrong.push(format!(
                "{c:?}: row {} says {says} from {} (victim the init: {expected_init}); merged: {verdict} from {from} ({init})",
                n + 1,
                r.from
            ));
        }
    }
    for (n, count) in used.iter().enumerate() {
        if *count == 0 {
            wrong.push(format!("row {} covers no combination", n + 1));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} combinations:\n{}",
        wrong.len(),
        all.len(),
        wrong.join("\n")
    );
    // The README's table is this one.
    let readme = include_str!("../../../../README.md");
    let table = render_table(&rows);
    assert!(
        readme.contains(&table),
        "README.md must hold the rule table as the merge decides it:\n{table}"
    );
}

fn render_table(rows: &[Row]) -> String {
    let mut t = String::from(
        "| the kernel saw of the init | the kernel's record of an OOM kill | the runtime says | the agent says | known from |\n|---|---|---|---|---|\n",
    );
    for r in rows {
        t.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            r.kernel, r.record, r.runtime, r.says, r.from
        ));
    }
    t
}
