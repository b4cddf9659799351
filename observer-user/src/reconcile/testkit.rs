//! Builders of the reconciler's views for the tests of every layer. Every `ContainerView` and
//! `PodView` of the tests is made here, so a field the reconciler adds is one edit.
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::{
    model::{ContainerId, PodUid},
    reconcile::{
        ContainerPhase, ContainerView, OomEvidence, OomScope, PodView, ScopeUnknown, Source,
    },
};

pub(crate) const NS: &str = "default";
pub(crate) const NAME: &str = "web";
pub(crate) const UID: &str = "0b6a3f5e-0000-4000-8000-000000000001";

/// Seconds after a fixed epoch, so that times in expected statuses are readable.
pub(crate) fn t(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
}

/// The one constructor of `ContainerView` in the tests.
pub(crate) fn cv(name: &str, restart: u32, phase: ContainerPhase) -> ContainerView {
    // A container id of the runtime's shape (64 hex digits), readable: the name's bytes, the attempt.
    let hex: String = name.bytes().map(|b| format!("{b:02x}")).collect();
    let id = ContainerId::parse(&format!("{:0>64}", format!("{hex}{restart:04x}")))
        .expect("64 hex digits");
    let running_or_done = matches!(phase, ContainerPhase::Running | ContainerPhase::Exited);
    ContainerView {
        id,
        name: name.to_string(),
        restart_count: restart,
        image: format!("registry.local/{name}:1"),
        phase,
        created_at: Some(t(10 * u64::from(restart))),
        started_at: running_or_done.then(|| t(10 * u64::from(restart) + 1)),
        finished_at: None,
        exit_code: None,
        signal: None,
        reason: None,
        exit_source: matches!(phase, ContainerPhase::Exited).then_some(Source::Kernel),
        runtime_reason: None,
        runtime_exit_code: None,
        message: None,
        message_complete: false,
        init_pid: Some(4000 + restart),
        oom_kills: 0,
        last_oom: None,
        kernel_seen: true,
        memory: None,
    }
}

/// An exited instance: code, and the signal that killed it (then code is 128 + signal).
pub(crate) fn exited(name: &str, restart: u32, code: i32, reason: &str) -> ContainerView {
    let mut c = cv(name, restart, ContainerPhase::Exited);
    c.exit_code = Some(code);
    c.signal = (code > 128).then(|| (code - 128) as u8);
    c.reason = Some(reason.to_string());
    c.finished_at = Some(t(10 * u64::from(restart) + 5));
    c
}

/// The kernel's record of an OOM kill in `c`; `init`: the victim was its init.
pub(crate) fn oom(c: &ContainerView, pid: u32, comm: &str, init: bool) -> OomEvidence {
    OomEvidence {
        time: c
            .finished_at
            .unwrap_or(t(10 * u64::from(c.restart_count) + 4)),
        container_id: c.id,
        pid,
        comm: comm.to_string(),
        init: Some(init),
        anon_rss_kb: Some(65_000),
        total_vm_kb: Some(80_000),
        oom_score_adj: Some(1000),
        group: false,
        oom_cgroup: None,
        limit_bytes: None,
        trigger_pid: None,
        trigger_container: None,
        source: Source::Kernel,
        scope: OomScope::Unknown(ScopeUnknown::LogNotRead),
        report: None,
    }
}

/// The one constructor of `PodView` in the tests.
pub(crate) fn view(containers: Vec<ContainerView>) -> PodView {
    let last_oom = containers
        .iter()
        .filter_map(|c| c.last_oom.clone())
        .max_by_key(|o| o.time);
    PodView {
        uid: PodUid::parse(UID).expect("a pod uid"),
        namespace: NS.to_string(),
        name: NAME.to_string(),
        sandbox_id: ContainerId::parse(&"5a4d".repeat(16)).expect("a sandbox id"),
        sandbox_ready: true,
        created_at: Some(t(0)),
        containers,
        last_oom,
    }
}
