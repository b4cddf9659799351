//! The merge rules: the runtime's status of a container, corrected by the kernel's evidence,
//! whether the agent watched the death (the probes) or not (the kernel log, read at start-up).
//!
//! - The kernel saw the init die: that is the exit (code, signal, exact time), whatever the runtime
//!   says or has not said yet.
//! - The init was OOM-killed (seen by the probes, or in the kernel log with the init's pid):
//!   OOMKilled, even when the runtime says Error / 137 (containerd #8180, #8893; CRI-O #6580).
//! - A runtime's OOMKilled with an exit code other than 137 is never passed on: an init killed by
//!   the OOM killer dies of SIGKILL, so that is the runtime's mislabel of a child's kill
//!   (kubernetes #104454). The container is Completed (exit 0) or Error, the runtime's account is
//!   kept beside it, and the kill is the evidence where the kernel log still holds it.
//! - The kernel lost the exit (only the cgroup emptying or vanishing was seen): the runtime's
//!   exit code and reason, if it has them; OOMKilled where the kernel log proves the init's kill.
//! - The init's pid unknown: a kill whose report lists the victim alone in the container's own
//!   cgroup was the init's; short of that, whether a victim was the init is not known.
//!
//! Every termination says how it is known ([`Source`]); nothing is guessed. README.md's table
//! ("How a container's end is decided") is checked against [`merge`] over every combination of
//! evidence (merge/tests.rs).
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_cri::v1 as api;

use super::{
    evidence::KernelEvidence,
    termination::{joined, TerminationMessage},
    view::{ContainerPhase, ContainerView, OomEvidence, OomScope, PodView, ScopeUnknown, Source},
};
use crate::{
    cgroup::{container_of_name, shape, CgroupKind, ContainerId},
    cri::KubeletLabels,
    kernel::{kmsg::LoggedOomKill, oom_report::Constraint, BootClock, OomKill},
    model::BootNs,
    pleg::{ContainerExit, Death, ExitReason},
};

/// The exit code of a process killed by SIGKILL, as runtimes report it.
const SIGKILL_EXIT: i32 = 137;

/// CRI timestamps are nanoseconds since the epoch; 0 means unset.
pub(crate) fn cri_time(ns: i64) -> Option<SystemTime> {
    (ns > 0).then(|| UNIX_EPOCH + Duration::from_nanos(ns as u64))
}

pub(crate) fn cri_phase(state: i32) -> ContainerPhase {
    match api::ContainerState::try_from(state) {
        Ok(api::ContainerState::ContainerCreated) => ContainerPhase::Created,
        Ok(api::ContainerState::ContainerRunning) => ContainerPhase::Running,
        Ok(api::ContainerState::ContainerExited) => ContainerPhase::Exited,
        _ => ContainerPhase::Unknown,
    }
}

/// What is known of one container, from every source.
#[derive(Clone, Copy)]
pub struct Inputs<'a> {
    pub id: ContainerId,
    /// The runtime's status; `None` while the runtime does not know the container yet.
    pub runtime: Option<&'a api::ContainerStatus>,
    /// The container's own termination message, read from the node with the runtime's status.
    pub termination: Option<&'a TerminationMessage>,
    /// The init's pid as the runtime reports it (verbose ContainerStatus), where asked.
    pub runtime_pid: Option<u32>,
    pub kernel: Option<&'a KernelEvidence>,
    /// Kills the kernel log attributes to this container (from before the agent started).
    pub logged: &'a [LoggedOomKill],
    /// The oldest time the kernel log still covers (`None`: unreadable). A kill after it that is
    /// not in the log did not happen.
    pub log_since: Option<SystemTime>,
}

impl<'a> Inputs<'a> {
    pub fn new(id: ContainerId) -> Self {
        Self {
            id,
            runtime: None,
            termination: None,
            runtime_pid: None,
            kernel: None,
            logged: &[],
            log_since: None,
        }
    }
}

/// The evidence of a kill the probes saw.
pub(crate) fn probe_oom(
    o: &OomKill,
    id: ContainerId,
    init: Option<bool>,
    clock: &BootClock,
) -> OomEvidence {
    OomEvidence {
        // When the OOM killer chose the victim, as the kernel log's report says it: the same
        // kill told from either source has one time (a large victim's exit comes seconds later).
        time: clock.to_system_time(o.marked_at),
        container_id: id,
        pid: o.victim.tgid,
        comm: o.victim_comm.to_string(),
        init,
        anon_rss_kb: o.memory.anon_rss_kb,
        total_vm_kb: o.memory.total_vm_kb,
        oom_score_adj: o.oom_score_adj,
        group: false,
        oom_cgroup: None,
        limit_bytes: None,
        trigger_pid: Some(o.trigger_tgid).filter(|&t| t != o.victim.tgid && t != 0),
        trigger_container: None,
        source: Source::Kernel,
        scope: OomScope::Unknown(ScopeUnknown::LogNotRead),
        report: None,
    }
}

/// The evidence of a kill from the kernel log.
pub(crate) fn logged_oom(k: &LoggedOomKill, id: ContainerId, init: Option<bool>) -> OomEvidence {
    OomEvidence {
        time: k.time,
        container_id: id,
        pid: k.pid,
        comm: k.comm.clone(),
        init,
        anon_rss_kb: k.anon_rss_kb,
        total_vm_kb: k.total_vm_kb,
        oom_score_adj: k.oom_score_adj,
        group: k.group,
        oom_cgroup: oom_cgroup(k),
        limit_bytes: k.limit_bytes,
        trigger_pid: k
            .report
            .as_ref()
            .and_then(|r| r.trigger.as_ref()?.pid)
            .filter(|&t| t != k.pid),
        trigger_container: trigger_container(k).filter(|t| *t != id),
        source: Source::KernelLog,
        scope: scope_of(k, id),
        report: k.report.clone(),
    }
}

/// Which limit a logged kill of container `id` hit: from the report's constraint and the cgroup
/// that ran out, read relative to the victim's own cgroup (the kill is `id`'s by kubelet's roots
/// or by the probes; the parser made sure `oom_memcg` holds `task_memcg`).
pub(crate) fn scope_of(k: &LoggedOomKill, id: ContainerId) -> OomScope {
    if k.report.as_ref().is_some_and(|r| r.refused) {
        return OomScope::Unknown(ScopeUnknown::ReportRefused);
    }
    if k.report.as_ref().is_some_and(|r| r.not_printed) {
        return OomScope::Unknown(ScopeUnknown::ReportNotPrinted);
    }
    let constraint = k.report.as_ref().map(|r| r.constraint);
    match constraint {
        Some(Some(Constraint::None | Constraint::Nodes)) => return OomScope::Node,
        // The report lost its `oom-kill:` line: no constraint, no cgroup.
        Some(None) => return OomScope::Unknown(ScopeUnknown::ReportIncomplete),
        Some(Some(Constraint::Memcg)) | None => {}
    }
    if k.oom_memcg.is_empty() {
        return OomScope::Unknown(ScopeUnknown::ReportIncomplete);
    }
    if k.oom_memcg == k.task_memcg {
        return OomScope::Container;
    }
    let holds_victim = k
        .task_memcg
        .strip_prefix(k.oom_memcg.trim_end_matches('/'))
        .is_some_and(|rest| rest.starts_with('/'));
    let victims_pod = shape(&k.task_memcg).pod().map(|p| p.uid);
    match shape(&k.oom_memcg) {
        // The victim sits in a cgroup nested in its container.
        CgroupKind::Container(c) if holds_victim && c.id == id => OomScope::Container,
        CgroupKind::Pod(p) if holds_victim && victims_pod == Some(p.uid) => OomScope::Pod,
        _ => OomScope::Cgroup(k.oom_memcg.clone()),
    }
}

/// The kill's report proves its victim was the container's init, whose pid is not known: the
/// cgroup that ran out is the container's own and its task dump lists no process but the
/// victim. While a container runs its init is in its cgroup, so the one process there is it.
fn victim_alone(k: &LoggedOomKill, id: ContainerId) -> bool {
    let Some(r) = k.report.as_ref().filter(|r| r.tasks_listed) else {
        return false;
    };
    scope_of(k, id) == OomScope::Container
        && r.task_count == 1
        && r.tasks.iter().all(|t| t.tgid == k.pid)
}

/// The trigger's container: its cpuset cgroup's name (`cpuset=` of the `oom-kill:` line), which
/// is the container's cgroup where kubelet's layout gives containers a cpuset (cgroup v2, and
/// v1's cpuset hierarchy).
fn trigger_container(k: &LoggedOomKill) -> Option<ContainerId> {
    container_of_name(&k.report.as_ref()?.trigger.as_ref()?.cpuset)
}

/// The cgroup whose limit was hit, where it is not the victim's own.
fn oom_cgroup(k: &LoggedOomKill) -> Option<String> {
    (k.oom_memcg != k.task_memcg && !k.oom_memcg.is_empty()).then(|| k.oom_memcg.clone())
}

/// One container's view from everything known about it.
pub fn merge(i: Inputs<'_>, clock: &BootClock) -> ContainerView {
    let mut v = ContainerView {
        kernel_seen: i.kernel.is_some(),
        ..ContainerView::new(i.id, String::new(), ContainerPhase::Unknown)
    };
    if let Some(s) = i.runtime {
        runtime_account(&mut v, s);
        if v.phase == ContainerPhase::Exited {
            if let Some(TerminationMessage::Read(own)) = i.termination {
                v.message = joined(v.message.as_deref(), own);
                v.message_complete = true;
            }
        }
    }
    let k = i.kernel;
    v.init_pid = k.and_then(KernelEvidence::init_pid).or(i.runtime_pid);
    if let Some((at, _, _)) = k.and_then(|k| k.started.as_ref()) {
        v.started_at = v.started_at.or(Some(clock.to_system_time(*at)));
        if matches!(v.phase, ContainerPhase::Created | ContainerPhase::Unknown) {
            v.phase = ContainerPhase::Running;
        }
    }
    match k.and_then(|k| k.exit.as_ref()) {
        Some((at, exit)) => {
            let runtime =
                (v.phase == ContainerPhase::Exited).then(|| (v.exit_code, v.reason.clone()));
            v.phase = ContainerPhase::Exited;
            match exit.status {
                Some(_) => kernel_exit(&mut v, *at, exit, clock),
                // The kernel knows it ended, not how: the runtime's account, if any, is better.
                None if runtime.is_some() => correct_unwatched(&mut v, &i),
                None => {
                    v.exit_code = Some(SIGKILL_EXIT);
                    v.finished_at = v.finished_at.or(Some(clock.to_system_time(*at)));
                    if log_proves_init_killed(v.init_pid, &i) {
                        v.reason = Some(ExitReason::OomKilled.as_str().to_string());
                        v.exit_source = Some(Source::KernelLog);
                    } else {
                        v.reason = Some(ExitReason::Unknown.as_str().to_string());
                        v.exit_source = Some(Source::Kernel);
                    }
                }
            }
            if let Some((code, reason)) = runtime {
                if v.runtime_reason.is_none() && (code != v.exit_code || reason != v.reason) {
                    v.runtime_exit_code = code;
                    v.runtime_reason = reason;
                }
            }
        }
        None if v.phase == ContainerPhase::Exited => correct_unwatched(&mut v, &i),
        None => {}
    }
    oom_account(&mut v, &i, clock);
    v
}

/// The first rule: the kernel saw the init die with its wait status, and that is the exit
/// (code, signal, reason, exact time), whatever the runtime says. `exit.status` is `Some`.
fn kernel_exit(v: &mut ContainerView, at: BootNs, exit: &ContainerExit, clock: &BootClock) {
    v.phase = ContainerPhase::Exited;
    if let Some(status) = exit.status {
        v.exit_code = Some(status.exit_code());
        v.signal = status.signal();
    }
    v.reason = Some(exit.reason.as_str().to_string());
    v.finished_at = Some(clock.to_system_time(at));
    v.exit_source = Some(Source::Kernel);
}

/// `view` once the reconciler has applied the kernel's exit `d` (the first rule, the one a
/// death read on the reader's thread decides): what the status layer computes a death's
/// transition from before the reconciler has run (`status::death`). `None` when the kernel
/// did not read the exit's status or the view does not know the container.
pub fn with_death(view: &PodView, d: &Death, clock: &BootClock) -> Option<PodView> {
    d.exit.status?;
    let mut v = view.clone();
    let c = v.containers.iter_mut().find(|c| c.id == d.container)?;
    kernel_exit(c, d.at, &d.exit, clock);
    Some(v)
}

fn runtime_account(v: &mut ContainerView, s: &api::ContainerStatus) {
    v.name = s
        .container_name()
        .or(s.metadata.as_ref().map(|m| m.name.as_str()))
        .unwrap_or_default()
        .to_string();
    v.restart_count = s
        .restart_count()
        .or(s.metadata.as_ref().map(|m| m.attempt))
        .unwrap_or(0);
    v.image = s
        .image
        .as_ref()
        .map(|i| i.image.clone())
        .filter(|i| !i.is_empty())
        .unwrap_or_else(|| s.image_ref.clone());
    v.phase = cri_phase(s.state);
    v.created_at = cri_time(s.created_at);
    v.started_at = cri_time(s.started_at);
    v.finished_at = cri_time(s.finished_at);
    if v.phase == ContainerPhase::Exited {
        v.exit_code = Some(s.exit_code);
        v.reason = Some(s.reason.clone()).filter(|r| !r.is_empty());
        v.exit_source = Some(Source::Runtime);
        v.message = runtime_message(&s.message);
        // A container that never started: kubelet writes the runtime's zero start as it is,
        // `time.Unix(0, 0)`, the epoch.
        if s.started_at == 0 {
            v.started_at = Some(UNIX_EPOCH);
        }
    }
}

/// The runtime's message, bounded as kubelet bounds a termination message (cut at a character).
fn runtime_message(m: &str) -> Option<String> {
    let m = m.trim_end();
    if m.is_empty() {
        return None;
    }
    let mut end = m.len().min(super::view::MAX_RUNTIME_MESSAGE);
    while !m.is_char_boundary(end) {
        end -= 1;
    }
    Some(m[..end].to_string())
}

/// OOM kills of the container: the probes' and the kernel log's (a kill both saw counts once).
fn oom_account(v: &mut ContainerView, i: &Inputs<'_>, clock: &BootClock) {
    let init_pid = v.init_pid;
    // Whether a victim was the init: by its pid where known; else what the container's own fate
    // proves (its init still runs, or ended other than by SIGKILL: never the victim; a runtime
    // that lost the exit says nothing of it).
    let init_survived = v.phase == ContainerPhase::Running
        || (v.phase == ContainerPhase::Exited
            && v.exit_code
                .is_some_and(|c| c != SIGKILL_EXIT && !runtime_lost_exit(c, &v.reason)));
    let init = |pid: u32| match init_pid {
        Some(p) => Some(p == pid),
        None if init_survived => Some(false),
        None => None,
    };
    let same_kill = |pid: u32, at, k: &LoggedOomKill| same_kill(pid, at, k, clock);
    let probe = i.kernel.and_then(|k| {
        // The init's own kill is the one the container died of; else the last.
        let o = k.init_kill.as_ref().or(k.last_oom.as_ref())?;
        let mut e = probe_oom(o, i.id, init(o.victim.tgid), clock);
        e.trigger_container = k.last_oom_trigger.filter(|t| *t != i.id);
        // The kernel log's line of the same kill names the cgroup whose limit was hit, and has
        // the memory figures the tracepoint lacks before Linux 6.8.
        // Matched on when the OOM killer chose the victim (when the log's `oom-kill:` line is
        // written), not on its exit: freeing a large victim's memory takes seconds (2 GiB under
        // emulation).
        if let Some(l) = i
            .logged
            .iter()
            .find(|l| same_kill(o.victim.tgid, o.marked_at, l))
        {
            e.group = l.group;
            e.scope = scope_of(l, i.id);
            e.report = l.report.clone();
            e.oom_cgroup = oom_cgroup(l);
            e.limit_bytes = l.limit_bytes;
            e.anon_rss_kb = e.anon_rss_kb.or(l.anon_rss_kb);
            e.total_vm_kb = e.total_vm_kb.or(l.total_vm_kb);
            e.oom_score_adj = e.oom_score_adj.or(l.oom_score_adj);
        }
        Some(e)
    });
    let probe_kills = i.kernel.map_or(0, |k| k.oom_kills);
    let seen_by_probes = |k: &LoggedOomKill| {
        i.kernel
            .is_some_and(|e| e.oom_victims.iter().any(|&(pid, at)| same_kill(pid, at, k)))
    };
    let logged: Vec<&LoggedOomKill> = i.logged.iter().filter(|k| !seen_by_probes(k)).collect();
    v.oom_kills = probe_kills + logged.len() as u32;
    // The init's kill where the log names it (or the whole group's), else the newest.
    let newest_logged = logged
        .iter()
        .max_by_key(|k| (init(k.pid) == Some(true), k.at_us))
        .map(|k| {
            let init = match init(k.pid) {
                None if victim_alone(k, i.id) => Some(true),
                known => known,
            };
            logged_oom(k, i.id, init)
        });
    v.last_oom = match (probe, newest_logged) {
        (Some(p), Some(l)) if l.time > p.time => Some(l),
        (Some(p), _) => Some(p),
        (None, l) => l,
    };
}

/// A termination the probes did not see: the runtime's account, corrected where the kernel log
/// or the runtime's own numbers prove it wrong.
fn correct_unwatched(v: &mut ContainerView, i: &Inputs<'_>) {
    v.exit_source = Some(Source::Runtime);
    let (Some(code), reason) = (v.exit_code, v.reason.clone()) else {
        return;
    };
    let init_killed = log_proves_init_killed(v.init_pid, i);
    let runtime_says_oom = reason.as_deref() == Some(ExitReason::OomKilled.as_str());
    let corrected = if init_killed && (code == SIGKILL_EXIT || runtime_lost_exit(code, &reason)) {
        // The kernel log names the init as the victim: what the runtime said (a SIGKILL, or
        // nothing it knew) was the OOM killer's.
        v.exit_source = Some(Source::KernelLog);
        v.exit_code = Some(SIGKILL_EXIT);
        Some(ExitReason::OomKilled)
    } else if runtime_says_oom && code != SIGKILL_EXIT {
        // A killed init dies of SIGKILL: OOMKilled with any other code is the runtime's
        // mislabel of a child's kill.
        Some(if code == 0 {
            ExitReason::Completed
        } else {
            ExitReason::Error
        })
    } else if runtime_says_oom && v.init_pid.is_some() && log_covers(i, v) && !init_killed {
        // SIGKILLed, but not by the OOM killer: the log covers the container's whole life and
        // names other victims (or none), never its init.
        v.exit_source = Some(Source::KernelLog);
        Some(ExitReason::Error)
    } else {
        None
    };
    if let Some(r) = corrected.filter(|r| Some(r.as_str()) != reason.as_deref()) {
        v.runtime_reason = reason;
        v.runtime_exit_code = Some(code);
        v.reason = Some(r.as_str().to_string());
    }
}

/// The kernel log proves the init was OOM-killed: it names the init's pid as a victim, or
/// killed the container's whole cgroup, or (the init's pid not known) reports a victim that was
/// the only process of the container.
fn log_proves_init_killed(init_pid: Option<u32>, i: &Inputs<'_>) -> bool {
    i.logged.iter().any(|k| k.group)
        || match init_pid {
            Some(pid) => i.logged.iter().any(|k| k.pid == pid),
            None => i.logged.iter().any(|k| victim_alone(k, i.id)),
        }
}

/// Whether a runtime's record of an exit says it lost it: containerd, restarted after the
/// container's task was gone, records exit 255 `Unknown` (internal/cri/server/restart.go,
/// `unknownExitCode`).
pub(crate) fn runtime_lost_exit(code: i32, reason: &Option<String>) -> bool {
    code == 255 && reason.as_deref() == Some("Unknown")
}

/// The kernel log reaches back before the container started.
fn log_covers(i: &Inputs<'_>, v: &ContainerView) -> bool {
    match (i.log_since, v.started_at.or(v.created_at)) {
        (Some(since), Some(start)) => since <= start,
        _ => false,
    }
}

/// Whether the probes' victim `pid`, chosen at `at`, is the log's kill `k`: the same pid, chosen
/// within 2 s of each other on the wall clock (pids are reused, never within seconds).
pub(crate) fn same_kill(
    pid: u32,
    at: crate::model::BootNs,
    k: &LoggedOomKill,
    clock: &BootClock,
) -> bool {
    pid == k.pid && abs_diff(clock.to_system_time(at), k.time) < Duration::from_secs(2)
}

fn abs_diff(a: SystemTime, b: SystemTime) -> Duration {
    a.duration_since(b).unwrap_or_else(|e| e.duration())
}

#[cfg(test)]
mod tests;
