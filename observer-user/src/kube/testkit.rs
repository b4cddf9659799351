//! Builders for the module's tests. Every `ContainerView` and `PodView` of the tests is made
//! here, so a field the reconciler adds is one edit.
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::{
    Container, Pod, PodReadinessGate, PodSpec, PodStatus, Probe, ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::reconcile::{ContainerPhase, ContainerView, OomEvidence, PodView};

pub const NS: &str = "default";
pub const NAME: &str = "web";
pub const UID: &str = "0b6a3f5e-0000-4000-8000-000000000001";

/// Seconds after a fixed epoch, so that times in expected statuses are readable.
pub fn t(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
}

/// The one constructor of `ContainerView` in the tests.
pub fn cv(name: &str, restart: u32, phase: ContainerPhase) -> ContainerView {
    let id = format!("{name}{restart:0>4}{}", "c".repeat(8));
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
        runtime_reason: None,
        runtime_exit_code: None,
        init_pid: Some(4000 + restart),
        oom_kills: 0,
        last_oom: None,
        kernel_seen: true,
    }
}

/// An exited instance: code, and the signal that killed it (then code is 128 + signal).
pub fn exited(name: &str, restart: u32, code: i32, reason: &str) -> ContainerView {
    let mut c = cv(name, restart, ContainerPhase::Exited);
    c.exit_code = Some(code);
    c.signal = (code > 128).then(|| (code - 128) as u8);
    c.reason = Some(reason.to_string());
    c.finished_at = Some(t(10 * u64::from(restart) + 5));
    c
}

/// The kernel's record of an OOM kill in `c`; `init`: the victim was its init.
pub fn oom(c: &ContainerView, pid: u32, comm: &str, init: bool) -> OomEvidence {
    OomEvidence {
        time: c
            .finished_at
            .unwrap_or(t(10 * u64::from(c.restart_count) + 4)),
        container_id: c.id.clone(),
        pid,
        comm: comm.to_string(),
        init,
        anon_rss_kb: Some(65_000),
        total_vm_kb: Some(80_000),
        oom_score_adj: Some(1000),
    }
}

/// The one constructor of `PodView` in the tests.
pub fn view(containers: Vec<ContainerView>) -> PodView {
    let last_oom = containers
        .iter()
        .filter_map(|c| c.last_oom.clone())
        .max_by_key(|o| o.time);
    PodView {
        uid: UID.to_string(),
        namespace: NS.to_string(),
        name: NAME.to_string(),
        sandbox_id: "5a4d".repeat(16),
        sandbox_ready: true,
        created_at: Some(t(0)),
        containers,
        last_oom,
    }
}

pub fn container(name: &str) -> Container {
    Container {
        name: name.to_string(),
        image: Some(format!("registry.local/{name}:1")),
        ..Default::default()
    }
}

pub fn with_memory_limit(mut c: Container, limit: &str) -> Container {
    c.resources = Some(ResourceRequirements {
        limits: Some([("memory".to_string(), Quantity(limit.to_string()))].into()),
        ..Default::default()
    });
    c
}

pub fn with_readiness_probe(mut c: Container) -> Container {
    c.readiness_probe = Some(Probe::default());
    c
}

/// A native sidecar: an init container with `restartPolicy: Always`.
pub fn sidecar(name: &str) -> Container {
    Container {
        restart_policy: Some("Always".into()),
        ..container(name)
    }
}

pub fn spec(restart_policy: &str, init: Vec<Container>, containers: Vec<Container>) -> PodSpec {
    PodSpec {
        node_name: Some("node-1".into()),
        restart_policy: Some(restart_policy.to_string()),
        init_containers: (!init.is_empty()).then_some(init),
        containers,
        ..Default::default()
    }
}

pub fn with_gate(mut s: PodSpec, condition_type: &str) -> PodSpec {
    s.readiness_gates = Some(vec![PodReadinessGate {
        condition_type: condition_type.to_string(),
    }]);
    s
}

pub fn pod(spec: PodSpec, status: Option<PodStatus>) -> Pod {
    Pod {
        metadata: ObjectMeta {
            namespace: Some(NS.into()),
            name: Some(NAME.into()),
            uid: Some(UID.into()),
            resource_version: Some("100".into()),
            ..Default::default()
        },
        spec: Some(spec),
        status,
    }
}
