//! Audit: kubelet's status in the API against the kernel's account, as findings. Pure.
//!
//! Each finding names the container instance (by container id) and what disagrees:
//! - the runtime's `OOMKilled` (containerd says OOMKilled / 0, kubernetes#104454) where the
//!   kernel saw a child killed under an init that went on and exited by itself;
//! - `Error` / 137 (or any reason but OOMKilled) where the kernel saw the init OOM-killed;
//! - an exit code other than the one the kernel recorded;
//! - a container still Running in the API longer than a grace after the kernel saw its init
//!   exit (kubelet's relist and status sync should have caught it by then).
use std::{fmt, time::Duration, time::SystemTime};

use k8s_openapi::api::core::v1::{ContainerStateTerminated, ContainerStatus, PodStatus};

use super::compute::terminated_reason;
use crate::reconcile::{ContainerPhase, ContainerView, PodView};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FindingKind {
    /// The API says OOMKilled; the kernel saw only a child killed, and the init exit by itself.
    OomKilledMisreported,
    /// The kernel saw the init OOM-killed; the API gives another reason.
    OomKillMissed,
    /// The API's exit code is not the one the kernel recorded.
    ExitCodeMismatch,
    /// The API still says Running, the kernel saw the init exit longer than the grace ago.
    StillRunning,
}

impl FindingKind {
    pub const ALL: [FindingKind; 4] = [
        FindingKind::OomKilledMisreported,
        FindingKind::OomKillMissed,
        FindingKind::ExitCodeMismatch,
        FindingKind::StillRunning,
    ];

    /// The Event reason.
    pub fn reason(self) -> &'static str {
        match self {
            FindingKind::OomKilledMisreported => "OOMKilledMisreported",
            FindingKind::OomKillMissed => "OOMKillMissed",
            FindingKind::ExitCodeMismatch => "ExitCodeMismatch",
            FindingKind::StillRunning => "DeathNotReported",
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for FindingKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.reason())
    }
}

/// One disagreement between the API and the kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    pub kind: FindingKind,
    pub container: String,
    pub container_id: String,
    /// Whether the container is an init container (for the Event's field path).
    pub init: bool,
    /// What the API says, and what the kernel saw.
    pub api: String,
    pub kernel: String,
}

impl Finding {
    pub fn message(&self) -> String {
        format!(
            "container {} ({}): the API says {}; the kernel saw {}",
            self.container,
            short(&self.container_id),
            self.api,
            self.kernel
        )
    }
}

fn short(id: &str) -> &str {
    &id[..id.len().min(12)]
}

/// The disagreements between `api` (kubelet's status) and the view, at `now`.
pub fn audit(api: &PodStatus, view: &PodView, now: SystemTime, grace: Duration) -> Vec<Finding> {
    let mut out = Vec::new();
    let lists = [
        (api.container_statuses.as_deref().unwrap_or(&[]), false),
        (api.init_container_statuses.as_deref().unwrap_or(&[]), true),
    ];
    for (list, init) in lists {
        for s in list {
            check(s, init, view, now, grace, &mut out);
        }
    }
    out
}

fn bare_id(id: &str) -> &str {
    id.split_once("://").map_or(id, |(_, rest)| rest)
}

fn check(
    s: &ContainerStatus,
    init: bool,
    view: &PodView,
    now: SystemTime,
    grace: Duration,
    out: &mut Vec<Finding>,
) {
    let find = |id: &str| {
        let id = crate::model::ContainerId::parse(bare_id(id))?;
        view.containers.iter().find(|c| c.id == id)
    };
    let state = s.state.clone().unwrap_or_default();
    // A running instance the kernel saw die.
    if state.running.is_some() {
        if let Some(v) = s.container_id.as_deref().and_then(find) {
            if v.phase == ContainerPhase::Exited && v.kernel_seen {
                let late = v
                    .finished_at
                    .and_then(|f| now.duration_since(f).ok())
                    .is_some_and(|d| d > grace);
                if late {
                    out.push(Finding {
                        kind: FindingKind::StillRunning,
                        container: s.name.clone(),
                        container_id: v.id.to_string(),
                        init,
                        api: "Running".into(),
                        kernel: format!(
                            "its init exit {} at {}",
                            exit_words(v),
                            super::compute::rfc3339(v.finished_at.unwrap_or(now))
                        ),
                    });
                }
            }
        }
    }
    let terminated = [
        state.terminated.as_ref(),
        s.last_state.as_ref().and_then(|l| l.terminated.as_ref()),
    ];
    for t in terminated.into_iter().flatten() {
        let Some(v) = t.container_id.as_deref().and_then(find) else {
            continue;
        };
        if v.phase != ContainerPhase::Exited || !v.kernel_seen || v.exit_code.is_none() {
            continue;
        }
        compare(s, t, v, init, out);
    }
}

fn exit_words(v: &ContainerView) -> String {
    match (v.signal, v.exit_code) {
        (Some(sig), Some(code)) => format!("by signal {sig} ({code})"),
        (None, Some(code)) => format!("with code {code}"),
        _ => "(how unknown)".into(),
    }
}

fn compare(
    s: &ContainerStatus,
    t: &ContainerStateTerminated,
    v: &ContainerView,
    init: bool,
    out: &mut Vec<Finding>,
) {
    let api_reason = t.reason.as_deref().unwrap_or("");
    let kernel_reason = terminated_reason(v);
    let api = format!(
        "{} / {}",
        if api_reason.is_empty() {
            "-"
        } else {
            api_reason
        },
        t.exit_code
    );
    let kernel_code = v.exit_code.unwrap_or(137);
    let mut push = |kind, kernel: String| {
        out.push(Finding {
            kind,
            container: s.name.clone(),
            container_id: v.id.to_string(),
            init,
            api: api.clone(),
            kernel,
        })
    };
    let init_killed =
        v.last_oom.as_ref().is_some_and(|o| o.init == Some(true)) || kernel_reason == "OOMKilled";
    if api_reason == "OOMKilled" && !init_killed {
        let kill = v
            .last_oom
            .as_ref()
            .map(|o| format!("a child ({} pid {}) OOM-killed, and ", o.comm, o.pid))
            .unwrap_or_default();
        push(
            FindingKind::OomKilledMisreported,
            format!("{kill}the init exit {} ({kernel_reason})", exit_words(v)),
        );
    } else if api_reason != "OOMKilled" && init_killed && v.last_oom.is_some() {
        let o = v
            .last_oom
            .as_ref()
            .map(|o| format!("{} pid {}", o.comm, o.pid))
            .unwrap_or_default();
        push(
            FindingKind::OomKillMissed,
            format!("the init ({o}) OOM-killed: OOMKilled / {kernel_code}"),
        );
    }
    if t.exit_code != kernel_code {
        push(
            FindingKind::ExitCodeMismatch,
            format!("exit {} ({kernel_reason})", exit_words(v)),
        );
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ContainerState, ContainerStateRunning};

    use super::*;
    use crate::kube::testkit::*;

    fn api_terminated(v: &ContainerView, code: i32, reason: &str) -> PodStatus {
        PodStatus {
            container_statuses: Some(vec![ContainerStatus {
                name: v.name.clone(),
                container_id: Some(format!("containerd://{}", v.id)),
                state: Some(ContainerState {
                    terminated: Some(ContainerStateTerminated {
                        container_id: Some(format!("containerd://{}", v.id)),
                        exit_code: code,
                        reason: Some(reason.into()),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            ..Default::default()
        }
    }

    fn kinds(f: &[Finding]) -> Vec<FindingKind> {
        f.iter().map(|f| f.kind).collect()
    }

    #[test]
    fn runtime_oomkilled_0_for_a_child_kill_under_a_healthy_init() {
        let mut v = exited("app", 0, 0, "Completed");
        v.runtime_reason = Some("OOMKilled".into());
        v.last_oom = Some(oom(&v, 4100, "hog", false));
        let f = audit(
            &api_terminated(&v, 0, "OOMKilled"),
            &view(vec![v]),
            t(100),
            Duration::from_secs(10),
        );
        assert_eq!(kinds(&f), [FindingKind::OomKilledMisreported]);
        let m = f[0].message();
        assert!(
            m.contains("the API says OOMKilled / 0") && m.contains("hog pid 4100"),
            "{m}"
        );
    }

    #[test]
    fn error_137_where_the_init_was_oom_killed() {
        let mut v = exited("app", 0, 137, "OOMKilled");
        v.last_oom = Some(oom(&v, 4000, "app", true));
        let f = audit(
            &api_terminated(&v, 137, "Error"),
            &view(vec![v]),
            t(100),
            Duration::from_secs(10),
        );
        assert_eq!(kinds(&f), [FindingKind::OomKillMissed]);
    }

    #[test]
    fn an_exit_code_the_kernel_did_not_record() {
        let v = exited("app", 0, 2, "Error");
        let f = audit(
            &api_terminated(&v, 1, "Error"),
            &view(vec![v]),
            t(100),
            Duration::from_secs(10),
        );
        assert_eq!(kinds(&f), [FindingKind::ExitCodeMismatch]);
    }

    #[test]
    fn still_running_in_the_api_past_the_grace() {
        let v = exited("app", 0, 1, "Error"); // finished at t(5)
        let api = PodStatus {
            container_statuses: Some(vec![ContainerStatus {
                name: "app".into(),
                container_id: Some(format!("containerd://{}", v.id)),
                state: Some(ContainerState {
                    running: Some(ContainerStateRunning::default()),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            ..Default::default()
        };
        let pv = view(vec![v]);
        let grace = Duration::from_secs(10);
        assert!(
            audit(&api, &pv, t(14), grace).is_empty(),
            "within the grace"
        );
        assert_eq!(
            kinds(&audit(&api, &pv, t(16), grace)),
            [FindingKind::StillRunning]
        );
    }

    #[test]
    fn agreement_and_instances_the_kernel_did_not_see_are_no_findings() {
        let v = exited("app", 0, 1, "Error");
        assert!(audit(
            &api_terminated(&v, 1, "Error"),
            &view(vec![v.clone()]),
            t(100),
            Duration::ZERO
        )
        .is_empty());
        let mut unseen = v;
        unseen.kernel_seen = false;
        assert!(audit(
            &api_terminated(&unseen, 0, "OOMKilled"),
            &view(vec![unseen]),
            t(100),
            Duration::ZERO
        )
        .is_empty());
    }
}
