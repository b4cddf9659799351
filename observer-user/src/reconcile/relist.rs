//! The relist diff, pure: what the runtime lists against the reconciled view, as kubelet's
//! generic PLEG compares each relist with the last. Every difference the event-driven path should
//! have reported is a miss; the pods that differ are fetched again.
use std::collections::{HashMap, HashSet};

use k8s_cri::v1 as api;

use super::{handle::NodeView, merge::cri_phase, view::ContainerPhase};
use crate::{
    cri::KubeletLabels,
    model::{ContainerId, PodUid},
};

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RelistDiff {
    /// Pods to fetch again, each once, in a stable order.
    pub fetch: Vec<PodUid>,
    /// Differences no event had reported (pods that changed with no work pending for them).
    pub missed: u64,
    /// Pods the runtime has that the view never had (counted only after the first relist).
    pub adopted: u64,
    /// Sandboxes or containers whose pod uid or id is not of a known shape (skipped).
    pub unparsable: u64,
}

/// What the diff needs to know beyond the two lists.
pub struct RelistContext<'a> {
    /// The first relist since start: everything is new then, and nothing is a miss.
    pub initial: bool,
    /// Pods with a request pending or in flight: their differences are being handled.
    pub pending: &'a dyn Fn(&PodUid) -> bool,
    /// Containers whose cgroup the kernel saw removed: the runtime forgets them later (kubelet's
    /// garbage collection, which no kernel event announces), so their absence is not a miss.
    pub removed: &'a dyn Fn(&ContainerId) -> bool,
}

pub fn diff(
    view: &NodeView,
    sandboxes: &[api::PodSandbox],
    containers: &[api::Container],
    cx: &RelistContext<'_>,
) -> RelistDiff {
    let mut out = RelistDiff::default();
    let mut pods: Vec<PodUid> = Vec::new();
    let mut listed: HashMap<PodUid, Vec<(ContainerId, ContainerPhase)>> = HashMap::new();
    for s in sandboxes {
        match s.pod_uid().and_then(PodUid::parse) {
            Some(uid) => pods.push(uid),
            None => out.unparsable += 1,
        }
    }
    for c in containers {
        match (
            c.pod_uid().and_then(PodUid::parse),
            ContainerId::parse(&c.id),
        ) {
            (Some(uid), Some(id)) => {
                pods.push(uid);
                listed
                    .entry(uid)
                    .or_default()
                    .push((id, cri_phase(c.state)));
            }
            _ => out.unparsable += 1,
        }
    }
    pods.sort_unstable();
    pods.dedup();
    let mut fetch: Vec<PodUid> = Vec::new();
    for uid in &pods {
        let pending = (cx.pending)(uid);
        let Some(pv) = view.get(uid) else {
            if !cx.initial && !pending {
                // Never heard of: the kernel missed its cgroups, or they predate us without
                // running processes.
                out.adopted += 1;
            }
            fetch.push(*uid);
            continue;
        };
        let listed = listed.get(uid).map(Vec::as_slice).unwrap_or_default();
        let mut differs = false;
        let mut refresh = false;
        for (id, phase) in listed {
            match pv.containers.iter().find(|v| v.id == *id) {
                None => differs = true,
                // The kernel saw the death before the runtime: not a miss.
                Some(v)
                    if v.phase == ContainerPhase::Exited && *phase == ContainerPhase::Running => {}
                Some(v) if v.phase != *phase => differs = true,
                Some(_) => {}
            }
        }
        for v in pv
            .containers
            .iter()
            .filter(|v| !listed.iter().any(|(id, _)| *id == v.id))
        {
            if (cx.removed)(&v.id) {
                refresh = true;
            } else {
                differs = true;
            }
        }
        if differs && !pending {
            out.missed += 1;
        }
        if differs || refresh {
            fetch.push(*uid);
        }
    }
    // Pods the runtime no longer has.
    let listed_pods: HashSet<&PodUid> = pods.iter().collect();
    let mut gone: Vec<PodUid> = view
        .keys()
        .filter(|u| !listed_pods.contains(u))
        .copied()
        .collect();
    gone.sort_unstable();
    for uid in gone {
        if !(cx.pending)(&uid) {
            out.missed += 1;
        }
        fetch.push(uid);
    }
    out.fetch = fetch;
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::view::{ContainerView, PodView};

    fn uid(n: u8) -> PodUid {
        PodUid::parse(&format!("{n:08x}-0000-4000-8000-000000000000")).unwrap()
    }

    fn cid(n: u8) -> ContainerId {
        ContainerId::parse(&format!("{n:064x}")).unwrap()
    }

    fn labels(pod: u8) -> HashMap<String, String> {
        [
            ("io.kubernetes.pod.uid".to_string(), uid(pod).to_string()),
            ("io.kubernetes.pod.name".into(), format!("p{pod}")),
            ("io.kubernetes.pod.namespace".into(), "default".into()),
        ]
        .into()
    }

    fn sandbox(pod: u8) -> api::PodSandbox {
        api::PodSandbox {
            id: cid(100 + pod).to_string(),
            labels: labels(pod),
            state: api::PodSandboxState::SandboxReady as i32,
            ..Default::default()
        }
    }

    fn container(pod: u8, n: u8, state: api::ContainerState) -> api::Container {
        api::Container {
            id: cid(n).to_string(),
            labels: labels(pod),
            state: state as i32,
            ..Default::default()
        }
    }

    fn cview(n: u8, phase: ContainerPhase) -> ContainerView {
        ContainerView {
            kernel_seen: true,
            ..ContainerView::new(cid(n), format!("c{n}"), phase)
        }
    }

    fn pview(pod: u8, containers: Vec<ContainerView>) -> (PodUid, PodView) {
        (
            uid(pod),
            PodView {
                uid: uid(pod),
                namespace: "default".into(),
                name: format!("p{pod}"),
                sandbox_id: cid(100 + pod),
                sandbox_ready: true,
                created_at: None,
                containers,
                last_oom: None,
            },
        )
    }

    const RUNNING: api::ContainerState = api::ContainerState::ContainerRunning;
    const EXITED: api::ContainerState = api::ContainerState::ContainerExited;

    fn run(
        view: &NodeView,
        s: &[api::PodSandbox],
        c: &[api::Container],
        initial: bool,
    ) -> RelistDiff {
        diff(
            view,
            s,
            c,
            &RelistContext {
                initial,
                pending: &|_| false,
                removed: &|_| false,
            },
        )
    }

    #[test]
    fn everything_is_new_at_the_first_relist_and_nothing_is_a_miss() {
        let d = run(
            &NodeView::new(),
            &[sandbox(1), sandbox(2)],
            &[container(1, 1, RUNNING)],
            true,
        );
        assert_eq!(d.fetch, [uid(1), uid(2)]);
        assert_eq!((d.missed, d.adopted), (0, 0));
    }

    #[test]
    fn a_pod_never_heard_of_later_is_adopted() {
        let d = run(&NodeView::new(), &[sandbox(1)], &[], false);
        assert_eq!(
            (d.fetch.as_slice(), d.adopted, d.missed),
            (&[uid(1)][..], 1, 0)
        );
    }

    #[test]
    fn agreement_fetches_nothing() {
        let view: NodeView = [pview(1, vec![cview(1, ContainerPhase::Running)])].into();
        let d = run(&view, &[sandbox(1)], &[container(1, 1, RUNNING)], false);
        assert_eq!(d, RelistDiff::default());
    }

    #[test]
    fn a_death_no_event_reported_is_a_miss() {
        let view: NodeView = [pview(1, vec![cview(1, ContainerPhase::Running)])].into();
        let d = run(&view, &[sandbox(1)], &[container(1, 1, EXITED)], false);
        assert_eq!((d.fetch.as_slice(), d.missed), (&[uid(1)][..], 1));
    }

    #[test]
    fn the_kernel_seeing_a_death_first_is_not_a_miss() {
        let view: NodeView = [pview(1, vec![cview(1, ContainerPhase::Exited)])].into();
        let d = run(&view, &[sandbox(1)], &[container(1, 1, RUNNING)], false);
        assert_eq!(d, RelistDiff::default());
    }

    #[test]
    fn a_new_container_no_event_reported_is_a_miss_unless_work_is_pending() {
        let view: NodeView = [pview(1, vec![])].into();
        let listed = [container(1, 7, RUNNING)];
        assert_eq!(run(&view, &[sandbox(1)], &listed, false).missed, 1);
        let d = diff(
            &view,
            &[sandbox(1)],
            &listed,
            &RelistContext {
                initial: false,
                pending: &|u| *u == uid(1),
                removed: &|_| false,
            },
        );
        assert_eq!((d.fetch.as_slice(), d.missed), (&[uid(1)][..], 0));
    }

    #[test]
    fn a_record_forgotten_after_the_kernel_saw_its_cgroup_removed_is_refreshed_not_missed() {
        let view: NodeView = [pview(1, vec![cview(1, ContainerPhase::Exited)])].into();
        let d = diff(
            &view,
            &[sandbox(1)],
            &[],
            &RelistContext {
                initial: false,
                pending: &|_| false,
                removed: &|c| *c == cid(1),
            },
        );
        assert_eq!((d.fetch.as_slice(), d.missed), (&[uid(1)][..], 0));
        // Without the kernel's word, the same absence is a miss.
        assert_eq!(run(&view, &[sandbox(1)], &[], false).missed, 1);
    }

    #[test]
    fn a_pod_gone_from_the_runtime_is_fetched_and_missed_unless_pending() {
        let view: NodeView = [pview(1, vec![]), pview(2, vec![])].into();
        let d = run(&view, &[sandbox(1)], &[], false);
        assert_eq!((d.fetch.as_slice(), d.missed), (&[uid(2)][..], 1));
    }

    #[test]
    fn odd_ids_are_counted_and_skipped() {
        let mut bad = container(1, 1, RUNNING);
        bad.id = "not-an-id".into();
        let mut no_uid = sandbox(2);
        no_uid.labels.clear();
        let d = run(&NodeView::new(), &[sandbox(1), no_uid], &[bad], true);
        assert_eq!((d.fetch.as_slice(), d.unparsable), (&[uid(1)][..], 2));
    }
}
