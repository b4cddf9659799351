//! The kernel log's OOM kills (from before the agent started), attributed to containers by the
//! victim's memory cgroup. Part of the reconciled evidence: every consumer of the view sees them,
//! not only `observer status`.
use std::{
    collections::{HashMap, VecDeque},
    time::SystemTime,
};

use crate::{
    cgroup::{ContainerId, KubeRoots},
    kernel::kmsg::{self, History, LogStats, LoggedOomKill},
};

/// Kills kept per container (the newest): bounded memory for a container that keeps losing
/// children to the OOM killer.
const KEPT_PER_CONTAINER: usize = 16;
/// Of those, the newest keep their whole report (the task dump, the breakdown; about 1 KiB
/// each); older ones keep the kill's own line.
const REPORTS_PER_CONTAINER: usize = 2;
/// Containers whose kills are kept: far above a node's containers (kubelet's default is 110
/// pods), so only kills of containers that no longer exist are ever let go, oldest first.
const CONTAINERS_KEPT: usize = 4096;

#[derive(Debug)]
pub(crate) struct OomHistory {
    /// kubelet's roots: a kill's memory cgroup names a container only below them.
    roots: KubeRoots,
    by_container: HashMap<ContainerId, Vec<LoggedOomKill>>,
    since: Option<SystemTime>,
    /// Kills in no container (a system service, a malformed path).
    pub outside: usize,
    /// The newest of those, kept for a while: the probes may yet name the victim's container
    /// (its memory cgroup can be above the container's, and a large victim's exit, which the
    /// probes report, comes seconds after the log's report).
    unplaced: VecDeque<LoggedOomKill>,
}

/// Kills in no container kept for the probes' word ([`OomHistory::place`]).
const UNPLACED_KEPT: usize = 16;

impl OomHistory {
    /// No kill yet.
    pub(crate) fn new(roots: KubeRoots) -> Self {
        Self {
            roots,
            by_container: HashMap::new(),
            since: None,
            outside: 0,
            unplaced: VecDeque::new(),
        }
    }

    /// Reads the kernel log (what it ignored counted in `stats`). Unreadable (no CAP_SYSLOG, no
    /// /dev/kmsg): said once, empty history.
    pub(crate) fn read(roots: KubeRoots, stats: &LogStats) -> Self {
        match kmsg::read_history() {
            Ok(h) => {
                stats.add(&h.ignored);
                Self::from_history(roots, h)
            }
            Err(e) => {
                tracing::info!(
                    "kernel log unreadable ({e}): OOM kills from before start-up are not known"
                );
                Self::new(roots)
            }
        }
    }

    pub(crate) fn from_history(roots: KubeRoots, h: History) -> Self {
        let mut me = Self {
            since: h.since,
            ..Self::new(roots)
        };
        for k in h.kills {
            me.add(k);
        }
        me
    }

    /// Adds a kill attributed by its victim's memory cgroup; returns the container it belongs to.
    pub(crate) fn add(&mut self, k: LoggedOomKill) -> Option<ContainerId> {
        match self.container_of(&k) {
            Some(id) => {
                self.add_to(id, k);
                Some(id)
            }
            None => {
                self.unplaced(k);
                None
            }
        }
    }

    /// A kill whose container is not known (yet).
    pub(crate) fn unplaced(&mut self, k: LoggedOomKill) {
        self.outside += 1;
        if self.unplaced.len() == UNPLACED_KEPT {
            self.unplaced.pop_front();
        }
        self.unplaced.push_back(k);
    }

    /// The probes saw container `id` lose a process: a kept kill `is_it` names is the
    /// container's. Returns whether one was.
    pub(crate) fn place(
        &mut self,
        id: ContainerId,
        is_it: impl Fn(&LoggedOomKill) -> bool,
    ) -> bool {
        let Some(i) = self.unplaced.iter().position(is_it) else {
            return false;
        };
        let k = self.unplaced.remove(i).expect("found");
        self.outside -= 1;
        self.add_to(id, k);
        true
    }

    /// The container of a kill's victim from its memory cgroup (its own, or one nested in it),
    /// below kubelet's roots only: a cgroup named like a container elsewhere is whoever made
    /// it's, and a real OOM kill there is no container's. On cgroup v2 the memory cgroup is the
    /// nearest one with the memory controller on, which can be above the container: then
    /// `None`, and the caller may know the victim from the probes.
    pub(crate) fn container_of(&self, k: &LoggedOomKill) -> Option<ContainerId> {
        self.roots.classify(&k.task_memcg).container().map(|c| c.id)
    }

    /// Adds a kill to a container's.
    pub(crate) fn add_to(&mut self, id: ContainerId, k: LoggedOomKill) {
        if !self.by_container.contains_key(&id) && self.by_container.len() >= CONTAINERS_KEPT {
            // The container whose newest kill is the oldest: the one least likely to be shown.
            let oldest = self
                .by_container
                .iter()
                .min_by_key(|(_, kills)| kills.last().map(|k| k.at_us))
                .map(|(id, _)| *id);
            if let Some(oldest) = oldest {
                self.by_container.remove(&oldest);
            }
        }
        let kills = self.by_container.entry(id).or_default();
        if kills.iter().any(|o| o.pid == k.pid && o.at_us == k.at_us) {
            return;
        }
        if kills.len() == KEPT_PER_CONTAINER {
            kills.remove(0);
        }
        kills.push(k);
        let older = kills.len().saturating_sub(REPORTS_PER_CONTAINER);
        for o in &mut kills[..older] {
            o.report = None;
        }
    }

    /// Keeps only the kills of containers `known` says exist (the runtime lists them, or the
    /// agent tracks them): the log's kills of containers long gone, or of ids no container ever
    /// had, are let go at each relist.
    pub(crate) fn retain(&mut self, known: impl Fn(&ContainerId) -> bool) {
        self.by_container.retain(|id, _| known(id));
    }

    /// Containers with kills kept.
    #[cfg(test)]
    pub(crate) fn containers(&self) -> usize {
        self.by_container.len()
    }

    pub(crate) fn kills_of(&self, id: &ContainerId) -> &[LoggedOomKill] {
        self.by_container
            .get(id)
            .map(Vec::as_slice)
            .unwrap_or_default()
    }

    /// The oldest time the log still covers.
    pub(crate) fn since(&self) -> Option<SystemTime> {
        self.since
    }

    /// Forgets a container's kills (its record is gone).
    pub(crate) fn forget(&mut self, id: &ContainerId) {
        self.by_container.remove(id);
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.by_container.values().map(Vec::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kills_are_attributed_by_the_victims_cgroup() {
        let id = "ab".repeat(32);
        let kill = |memcg: &str, pid| LoggedOomKill {
            pid,
            task_memcg: memcg.into(),
            ..Default::default()
        };
        let roots = KubeRoots::of_kubelet_root("/").unwrap();
        let h = OomHistory::from_history(roots, History {
            kills: vec![
                kill(&format!("/kubepods/burstable/pod0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0/{id}"), 1),
                kill(&format!("/kubepods.slice/kubepods-pod0b1c2d3e_4f50_6172_8394_a5b6c7d8e9f0.slice/cri-containerd-{id}.scope/sub"), 2),
                kill("/system.slice/foo.service", 3),
                // A real kill in a cgroup named like the container, outside kubelet's roots.
                kill(&format!("/user.slice/user-1000.slice/user@1000.service/kubepods/burstable/pod0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0/{id}"), 4),
            ],
            ..History::default()
        });
        let id = ContainerId::parse(&id).unwrap();
        assert_eq!(
            h.kills_of(&id).iter().map(|k| k.pid).collect::<Vec<_>>(),
            [1, 2]
        );
        assert_eq!((h.outside, h.len()), (2, 2));
    }

    #[test]
    fn kills_of_containers_that_do_not_exist_are_let_go() {
        let mut h =
            OomHistory::from_history(KubeRoots::of_kubelet_root("/").unwrap(), History::default());
        let id = |n: u32| ContainerId::parse(&format!("{n:064x}")).unwrap();
        let kill = |n: u64| LoggedOomKill {
            at_us: n,
            pid: n as u32,
            ..Default::default()
        };
        // Forged or long-gone ids, past the bound: the oldest are let go, the newest kept.
        for n in 0..(CONTAINERS_KEPT as u32 + 100) {
            h.add_to(id(n), kill(u64::from(n)));
        }
        assert_eq!(h.containers(), CONTAINERS_KEPT);
        assert!(h.kills_of(&id(0)).is_empty() && h.kills_of(&id(99)).is_empty());
        assert_eq!(h.kills_of(&id(100)).len(), 1);
        // A relist keeps only what the runtime lists or the agent tracks.
        h.retain(|c| *c == id(4000));
        assert_eq!(h.containers(), 1);
        assert_eq!(h.kills_of(&id(4000))[0].pid, 4000);
    }
}
