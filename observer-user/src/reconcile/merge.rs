//! The merge rules: the runtime's status of a container, corrected by the kernel's evidence.
//!
//! - The kernel saw the init die: that is the exit (code, signal, exact time), whatever the runtime
//!   says or has not said yet.
//! - The kernel saw the init OOM-killed: OOMKilled, even when the runtime says Error / 137
//!   (containerd #8180, #8893; CRI-O #6580).
//! - A child was OOM-killed and the init then exited 0: Completed, with the kill kept as evidence;
//!   containerd says OOMKilled / 0 there (kubernetes #104454).
//! - The kernel lost the exit (only the cgroup emptying or vanishing was seen): the runtime's
//!   exit code and reason, if it has them.
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_cri::v1 as api;

use super::{
    evidence::KernelEvidence,
    view::{ContainerPhase, ContainerView, OomEvidence},
};
use crate::{
    cri::KubeletLabels,
    kernel::{BootClock, OomKill},
    pleg::ExitReason,
};

/// CRI timestamps are nanoseconds since the epoch; 0 means unset.
pub fn cri_time(ns: i64) -> Option<SystemTime> {
    (ns > 0).then(|| UNIX_EPOCH + Duration::from_nanos(ns as u64))
}

pub fn cri_phase(state: i32) -> ContainerPhase {
    match api::ContainerState::try_from(state) {
        Ok(api::ContainerState::ContainerCreated) => ContainerPhase::Created,
        Ok(api::ContainerState::ContainerRunning) => ContainerPhase::Running,
        Ok(api::ContainerState::ContainerExited) => ContainerPhase::Exited,
        _ => ContainerPhase::Unknown,
    }
}

pub fn oom_evidence(o: &OomKill, init: bool, clock: &BootClock) -> OomEvidence {
    OomEvidence {
        time: clock.to_system_time(o.at),
        container_id: String::new(),
        pid: o.victim.tgid,
        comm: o.victim_comm.to_string(),
        init,
        anon_rss_kb: o.memory.anon_rss_kb,
        total_vm_kb: o.memory.total_vm_kb,
        oom_score_adj: o.oom_score_adj,
    }
}

/// One container's view from the runtime's status (`None` while the runtime does not know it
/// yet) and the kernel's evidence.
pub fn merge(
    id: &str,
    cri: Option<&api::ContainerStatus>,
    kernel: Option<&KernelEvidence>,
    clock: &BootClock,
) -> ContainerView {
    let mut v = ContainerView {
        id: id.to_string(),
        name: String::new(),
        restart_count: 0,
        image: String::new(),
        phase: ContainerPhase::Unknown,
        created_at: None,
        started_at: None,
        finished_at: None,
        exit_code: None,
        signal: None,
        reason: None,
        runtime_reason: None,
        runtime_exit_code: None,
        init_pid: None,
        oom_kills: 0,
        last_oom: None,
        kernel_seen: kernel.is_some(),
    };
    if let Some(s) = cri {
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
        }
    }
    let Some(k) = kernel else { return v };
    v.oom_kills = k.oom_kills;
    v.init_pid = k.init_pid();
    if let Some((at, _, _)) = k.started {
        v.started_at = v.started_at.or(Some(clock.to_system_time(at)));
        if matches!(v.phase, ContainerPhase::Created | ContainerPhase::Unknown) {
            v.phase = ContainerPhase::Running;
        }
    }
    if let Some(o) = &k.last_oom {
        let init = v.init_pid == Some(o.victim.tgid);
        v.last_oom = Some(OomEvidence {
            container_id: id.to_string(),
            ..oom_evidence(o, init, clock)
        });
    }
    if let Some((at, exit)) = &k.exit {
        let runtime = (v.phase == ContainerPhase::Exited).then(|| (v.exit_code, v.reason.clone()));
        v.phase = ContainerPhase::Exited;
        match exit.status {
            Some(status) => {
                v.exit_code = Some(status.exit_code());
                v.signal = status.signal();
                v.reason = Some(exit.reason.as_str().to_string());
                v.finished_at = Some(clock.to_system_time(*at));
            }
            // The kernel knows it ended, not how: the runtime's account, if any, is better.
            None if runtime.is_some() => {}
            None => {
                v.exit_code = Some(137);
                v.reason = Some(ExitReason::Unknown.as_str().to_string());
                v.finished_at = v.finished_at.or(Some(clock.to_system_time(*at)));
            }
        }
        if let Some((code, reason)) = runtime {
            if code != v.exit_code || reason != v.reason {
                v.runtime_exit_code = code;
                v.runtime_reason = reason;
            }
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        kernel::{BootNs, Comm, OomMemory, Task, WaitStatus},
        pleg::ContainerExit,
    };

    const ID: &str = "c0ffee";

    fn status(state: api::ContainerState, exit_code: i32, reason: &str) -> api::ContainerStatus {
        let mut s = api::ContainerStatus {
            id: ID.into(),
            metadata: Some(api::ContainerMetadata {
                name: "app".into(),
                attempt: 2,
            }),
            state: state as i32,
            created_at: 1_000_000_000,
            started_at: 2_000_000_000,
            finished_at: if state == api::ContainerState::ContainerExited {
                3_000_000_000
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
            at: BootNs(5),
            marked_at: BootNs(4),
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

    fn died(
        status: Option<WaitStatus>,
        reason: ExitReason,
        pid: u32,
    ) -> Option<(BootNs, ContainerExit)> {
        Some((
            BootNs(6),
            ContainerExit {
                status,
                reason,
                pid: Some(pid),
                comm: Some(Comm::from("app")),
            },
        ))
    }

    fn evidence(
        exit: Option<(BootNs, ContainerExit)>,
        last_oom: Option<Box<OomKill>>,
    ) -> KernelEvidence {
        KernelEvidence {
            created: Some(BootNs(1)),
            started: Some((BootNs(2), 100, Comm::from("app"))),
            oom_kills: u32::from(last_oom.is_some()),
            last_oom,
            exit,
            removed: None,
        }
    }

    #[test]
    fn runtime_only() {
        let v = merge(
            ID,
            Some(&status(api::ContainerState::ContainerExited, 3, "Error")),
            None,
            &BootClock::new(),
        );
        assert_eq!(
            (v.phase, v.exit_code, v.reason.as_deref(), v.restart_count),
            (ContainerPhase::Exited, Some(3), Some("Error"), 2)
        );
        assert_eq!(v.name, "app");
        assert!(!v.kernel_seen);
    }

    #[test]
    fn kernel_death_wins_while_the_runtime_still_says_running() {
        let k = evidence(
            died(Some(WaitStatus::exited(3)), ExitReason::Error, 100),
            None,
        );
        let v = merge(
            ID,
            Some(&status(api::ContainerState::ContainerRunning, 0, "")),
            Some(&k),
            &BootClock::new(),
        );
        assert_eq!(
            (v.phase, v.exit_code, v.reason.as_deref()),
            (ContainerPhase::Exited, Some(3), Some("Error"))
        );
        assert!(v.finished_at.is_some());
        assert_eq!(
            v.runtime_reason, None,
            "the runtime had not said anything to disagree with"
        );
    }

    #[test]
    fn init_oom_kill_is_oomkilled_even_when_the_runtime_says_error_137() {
        let k = evidence(
            died(
                Some(WaitStatus::signaled(9, false)),
                ExitReason::OomKilled,
                100,
            ),
            Some(oom(100)),
        );
        let v = merge(
            ID,
            Some(&status(api::ContainerState::ContainerExited, 137, "Error")),
            Some(&k),
            &BootClock::new(),
        );
        assert_eq!(
            (v.exit_code, v.signal, v.reason.as_deref()),
            (Some(137), Some(9), Some("OOMKilled"))
        );
        assert_eq!(
            (v.runtime_exit_code, v.runtime_reason.as_deref()),
            (Some(137), Some("Error"))
        );
        let oom = v.last_oom.unwrap();
        assert!(oom.init);
        assert_eq!(
            (oom.pid, oom.comm.as_str(), oom.anon_rss_kb),
            (100, "hog", Some(31_000))
        );
    }

    #[test]
    fn child_oom_then_clean_exit_is_completed_with_the_kill_as_evidence() {
        let k = evidence(
            died(Some(WaitStatus::exited(0)), ExitReason::Completed, 100),
            Some(oom(101)),
        );
        let v = merge(
            ID,
            Some(&status(
                api::ContainerState::ContainerExited,
                0,
                "OOMKilled",
            )),
            Some(&k),
            &BootClock::new(),
        );
        assert_eq!(
            (v.exit_code, v.reason.as_deref()),
            (Some(0), Some("Completed"))
        );
        assert_eq!(
            (v.runtime_exit_code, v.runtime_reason.as_deref()),
            (Some(0), Some("OOMKilled"))
        );
        let oom = v.last_oom.unwrap();
        assert!(!oom.init);
        assert_eq!(oom.pid, 101);
        assert_eq!(v.oom_kills, 1);
    }

    #[test]
    fn child_oom_in_a_running_container_stays_running() {
        let k = evidence(None, Some(oom(101)));
        let v = merge(
            ID,
            Some(&status(api::ContainerState::ContainerRunning, 0, "")),
            Some(&k),
            &BootClock::new(),
        );
        assert_eq!(
            (v.phase, v.oom_kills, v.init_pid),
            (ContainerPhase::Running, 1, Some(100))
        );
        assert!(v.reason.is_none());
    }

    #[test]
    fn lost_exit_defers_to_the_runtime_or_is_unknown() {
        let k = evidence(died(None, ExitReason::Unknown, 100), None);
        let v = merge(
            ID,
            Some(&status(api::ContainerState::ContainerExited, 2, "Error")),
            Some(&k),
            &BootClock::new(),
        );
        assert_eq!((v.exit_code, v.reason.as_deref()), (Some(2), Some("Error")));
        let v = merge(
            ID,
            Some(&status(api::ContainerState::ContainerRunning, 0, "")),
            Some(&k),
            &BootClock::new(),
        );
        assert_eq!(
            (v.phase, v.exit_code, v.reason.as_deref()),
            (
                ContainerPhase::Exited,
                Some(137),
                Some("ContainerStatusUnknown")
            )
        );
    }

    #[test]
    fn kernel_start_before_the_runtime_reports_it() {
        let k = evidence(None, None);
        let v = merge(
            ID,
            Some(&status(api::ContainerState::ContainerCreated, 0, "")),
            Some(&k),
            &BootClock::new(),
        );
        assert_eq!((v.phase, v.init_pid), (ContainerPhase::Running, Some(100)));
        let v = merge(ID, None, Some(&k), &BootClock::new());
        assert_eq!(v.phase, ContainerPhase::Running);
    }
}
