//! What one pod's snapshot from the runtime changes, decided from the snapshot and what is
//! tracked, pure (as [`super::relist::diff`] is for a relist); the reconciler carries it out.
use std::{collections::HashMap, time::Duration};

use k8s_cri::v1 as api;
use tokio::time::Instant;

use super::{
    fetch::PodSnapshot, merge::cri_phase, termination::TerminationMessage, view::ContainerPhase,
    Tracked,
};
use crate::model::{ContainerId, PodUid};

#[derive(Debug)]
pub(super) struct SnapshotPlan {
    /// Ids of no known shape (skipped, counted).
    pub unparsable: Vec<String>,
    /// Containers to forget: the kernel reported them and the runtime does not know them past the
    /// grace (or their cgroup is gone), or their pod is gone. `true`: the runtime never knew it.
    pub forget: Vec<(ContainerId, bool)>,
    /// Containers the kernel reported that the runtime does not know yet, and since when.
    pub unknown: Vec<(ContainerId, Instant)>,
    /// Ask the runtime again shortly: it lacks or lags behind something the kernel reported.
    pub again: bool,
    pub sandbox: SandboxPlan,
}

#[derive(Debug)]
pub(super) enum SandboxPlan {
    /// The runtime has no such pod (any more): it leaves the view.
    Gone,
    /// The newest sandbox's id is of no known shape: the view is left as it is.
    Unparsable,
    Present(Box<PodPlan>),
}

#[derive(Debug)]
pub(super) struct PodPlan {
    /// The newest sandbox (a ready one first).
    pub sandbox: api::PodSandbox,
    pub sandbox_id: ContainerId,
    pub containers: Vec<ContainerPlan>,
}

/// One container's status, and what the reconciler keeps of it.
#[derive(Debug)]
pub(super) struct ContainerPlan {
    pub id: ContainerId,
    pub status: api::ContainerStatus,
    /// Since when the runtime lags behind the kernel (a death or start it has not caught up
    /// with); `None`: it does not.
    pub lagging_since: Option<Instant>,
    /// The init's pid, when the snapshot asked (a dead container whose account may hinge on it).
    pub pid: Option<u32>,
    /// Its termination message from the node's files, where it has exited.
    pub termination: Option<TerminationMessage>,
}

pub(super) fn plan(
    uid: PodUid,
    snap: PodSnapshot,
    tracked: &HashMap<ContainerId, Tracked>,
    now: Instant,
    grace: Duration,
) -> SnapshotPlan {
    let mut plan = SnapshotPlan {
        unparsable: Vec::new(),
        forget: Vec::new(),
        unknown: Vec::new(),
        again: false,
        sandbox: SandboxPlan::Gone,
    };
    let mut known: Vec<ContainerId> = Vec::new();
    let mut statuses: Vec<(ContainerId, api::ContainerStatus)> = Vec::new();
    for s in snap.containers {
        match ContainerId::parse(&s.id) {
            Some(id) => {
                known.push(id);
                statuses.push((id, s));
            }
            None => plan.unparsable.push(s.id),
        }
    }
    known.extend(
        snap.sandboxes
            .iter()
            .filter_map(|s| ContainerId::parse(&s.id)),
    );

    // Kernel-reported containers of this pod the runtime does not know.
    for (id, t) in tracked
        .iter()
        .filter(|(id, t)| t.pod == uid && !known.contains(id))
    {
        let removed = t.kernel.as_ref().is_some_and(|k| k.removed.is_some());
        let since = t.unknown_since.unwrap_or(now);
        if removed || now.duration_since(since) >= grace {
            // Known once and now gone, or never known: either way nothing more will come.
            plan.forget.push((*id, !removed && t.runtime.is_none()));
        } else {
            plan.unknown.push((*id, since));
            plan.again = true;
        }
    }

    let Some(sandbox) = newest_sandbox(&snap.sandboxes) else {
        plan.forget
            .extend(statuses.into_iter().map(|(id, _)| (id, false)));
        return plan;
    };
    let Some(sandbox_id) = ContainerId::parse(&sandbox.id) else {
        plan.unparsable.push(sandbox.id.clone());
        plan.sandbox = SandboxPlan::Unparsable;
        return plan;
    };
    let mut containers = Vec::with_capacity(statuses.len());
    for (id, status) in statuses {
        let t = tracked.get(&id);
        // The kernel saw the death (or the start) first; the runtime's account (finished
        // time, its reason, the running init's pid to check) follows within milliseconds.
        // Ask again shortly rather than wait for the relist.
        let phase = cri_phase(status.state);
        let lags = t.and_then(|t| t.kernel.as_ref()).is_some_and(|k| {
            (k.exit.is_some() && phase != ContainerPhase::Exited)
                || (k.started.is_some() && phase == ContainerPhase::Created)
        });
        let lagging_since = lags.then(|| t.and_then(|t| t.lagging_since).unwrap_or(now));
        if let Some(since) = lagging_since {
            plan.again |= now.duration_since(since) < grace;
        }
        containers.push(ContainerPlan {
            id,
            pid: snap.pids.get(&status.id).copied(),
            termination: snap.messages.get(&status.id).cloned(),
            status,
            lagging_since,
        });
    }
    plan.sandbox = SandboxPlan::Present(Box::new(PodPlan {
        sandbox: sandbox.clone(),
        sandbox_id,
        containers,
    }));
    plan
}

fn newest_sandbox(s: &[api::PodSandbox]) -> Option<&api::PodSandbox> {
    s.iter().max_by_key(|s| {
        (
            s.state == api::PodSandboxState::SandboxReady as i32,
            s.created_at,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        kernel::{BootNs, WaitStatus},
        pleg::{ContainerExit, ExitReason},
        reconcile::KernelEvidence,
    };

    const GRACE: Duration = Duration::from_secs(2);

    fn uid() -> PodUid {
        PodUid::parse("00000001-0000-4000-8000-000000000000").unwrap()
    }

    fn cid(n: u8) -> ContainerId {
        ContainerId::parse(&format!("{n:064x}")).unwrap()
    }

    fn status(n: u8, state: api::ContainerState) -> api::ContainerStatus {
        api::ContainerStatus {
            id: cid(n).to_string(),
            state: state as i32,
            ..Default::default()
        }
    }

    fn snapshot(containers: Vec<api::ContainerStatus>) -> PodSnapshot {
        PodSnapshot {
            sandboxes: vec![api::PodSandbox {
                id: cid(100).to_string(),
                state: api::PodSandboxState::SandboxReady as i32,
                ..Default::default()
            }],
            containers,
            pids: HashMap::new(),
            messages: HashMap::new(),
        }
    }

    /// What the kernel reported of container `n`: its death, when `died`.
    fn reported(n: u8, died: bool) -> (ContainerId, Tracked) {
        let mut t = Tracked::new(uid());
        let mut k = KernelEvidence::default();
        if died {
            k.exit = Some((
                BootNs(1),
                ContainerExit {
                    status: Some(WaitStatus(9)),
                    reason: ExitReason::Error,
                    pid: Some(7),
                    comm: None,
                },
            ));
        } else {
            k.created = Some(BootNs(1));
        }
        t.kernel = Some(k);
        (cid(n), t)
    }

    #[test]
    fn a_container_the_runtime_does_not_know_is_asked_about_until_the_grace_then_dropped() {
        let now = Instant::now();
        let mut tracked: HashMap<_, _> = [reported(1, false)].into();
        let p = plan(uid(), snapshot(vec![]), &tracked, now, GRACE);
        assert_eq!((p.unknown, p.again), (vec![(cid(1), now)], true));
        assert!(p.forget.is_empty());

        tracked.get_mut(&cid(1)).unwrap().unknown_since = Some(now);
        let p = plan(uid(), snapshot(vec![]), &tracked, now + GRACE, GRACE);
        assert_eq!(p.forget, vec![(cid(1), true)], "never known: counted");
        assert!(!p.again);
        let SandboxPlan::Present(pod) = p.sandbox else {
            panic!("the sandbox is there");
        };
        assert_eq!((pod.sandbox_id, pod.containers.len()), (cid(100), 0));
    }

    #[test]
    fn a_runtime_lagging_behind_a_death_is_asked_again_until_the_grace() {
        let now = Instant::now();
        let mut tracked: HashMap<_, _> = [reported(1, true)].into();
        let running = || snapshot(vec![status(1, api::ContainerState::ContainerRunning)]);
        let p = plan(uid(), running(), &tracked, now, GRACE);
        let SandboxPlan::Present(pod) = p.sandbox else {
            panic!("the sandbox is there");
        };
        assert_eq!(
            (pod.containers[0].lagging_since, p.again),
            (Some(now), true)
        );

        tracked.get_mut(&cid(1)).unwrap().lagging_since = Some(now);
        let p = plan(uid(), running(), &tracked, now + GRACE, GRACE);
        let SandboxPlan::Present(pod) = p.sandbox else {
            panic!("the sandbox is there");
        };
        assert_eq!(
            (pod.containers[0].lagging_since, p.again),
            (Some(now), false),
            "past the grace the runtime's word stands until the relist"
        );

        let exited = snapshot(vec![status(1, api::ContainerState::ContainerExited)]);
        let p = plan(uid(), exited, &tracked, now + GRACE, GRACE);
        let SandboxPlan::Present(pod) = p.sandbox else {
            panic!("the sandbox is there");
        };
        assert_eq!((pod.containers[0].lagging_since, p.again), (None, false));
    }

    #[test]
    fn a_pod_without_a_sandbox_is_gone_with_its_containers() {
        let mut snap = snapshot(vec![status(1, api::ContainerState::ContainerExited)]);
        snap.sandboxes.clear();
        let p = plan(uid(), snap, &HashMap::new(), Instant::now(), GRACE);
        assert!(matches!(p.sandbox, SandboxPlan::Gone));
        assert_eq!(p.forget, vec![(cid(1), false)]);

        let mut snap = snapshot(vec![]);
        snap.sandboxes[0].id = "not-an-id".into();
        let p = plan(uid(), snap, &HashMap::new(), Instant::now(), GRACE);
        assert!(matches!(p.sandbox, SandboxPlan::Unparsable));
        assert_eq!(p.unparsable, vec!["not-an-id".to_string()]);
    }
}
