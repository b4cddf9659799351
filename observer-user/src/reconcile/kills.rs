//! The OOM kills per container and scope (`observer_oom_kills_total`), counted where the view
//! changes: each new kill once, and a pod's series dropped when it leaves the node.
//!
//! A kill the probes saw is counted once the kernel log's report names its scope (milliseconds
//! later: the agent re-reads the log on each kill), or as `unknown` when the report has not come
//! [`SCOPE_GRACE`] after the kill. Kills counted in one step (a group kill) take the scope of the
//! newest: one report covers them all.
use std::{
    collections::HashMap,
    time::{Duration, SystemTime},
};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
};

use super::view::{OomScope, PodView, ScopeUnknown};
use crate::model::{ContainerId, PodUid};

/// How long a kill waits for the kernel log's report before it is counted (and its Event
/// published, `status::manager`) with scope `unknown`.
pub(crate) const SCOPE_GRACE: Duration = Duration::from_secs(2);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ContainerLabels {
    pub namespace: String,
    pub pod: String,
    pub container: String,
}

/// [`ContainerLabels`] and the kill's scope (`container`, `pod`, `cgroup`, `node`, `unknown`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct OomKillLabels {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub scope: &'static str,
}

/// The family, and the kills already counted per container.
pub(super) struct KillCounter {
    family: Family<OomKillLabels, Counter>,
    /// Per container: its labels, the kills counted, the scopes its series were counted under.
    seen: HashMap<PodUid, HashMap<ContainerId, Seen>>,
    /// Pods with a kill held for its report, and when its grace ends: counted then even if the
    /// view does not change again ([`KillCounter::next_held`]).
    held: HashMap<PodUid, SystemTime>,
}

struct Seen {
    labels: ContainerLabels,
    counted: u32,
    scopes: Vec<&'static str>,
}

impl Seen {
    fn series(&self) -> impl Iterator<Item = OomKillLabels> + '_ {
        self.scopes.iter().map(|scope| OomKillLabels {
            namespace: self.labels.namespace.clone(),
            pod: self.labels.pod.clone(),
            container: self.labels.container.clone(),
            scope,
        })
    }
}

impl KillCounter {
    pub(super) fn new(family: Family<OomKillLabels, Counter>) -> Self {
        Self {
            family,
            seen: HashMap::new(),
            held: HashMap::new(),
        }
    }

    /// When the first held kill's grace ends.
    pub(crate) fn next_held(&self) -> Option<SystemTime> {
        self.held.values().min().copied()
    }

    /// The pods whose held kill's grace has ended by `now`: to be updated again.
    pub(crate) fn held_due(&self, now: SystemTime) -> Vec<PodUid> {
        self.held
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(uid, _)| *uid)
            .collect()
    }

    /// The pod's view is now `view` (`None`: it left the node).
    pub(crate) fn update_at(&mut self, uid: PodUid, view: Option<&PodView>, now: SystemTime) {
        self.held.remove(&uid);
        let Some(view) = view else {
            for seen in self
                .seen
                .remove(&uid)
                .into_iter()
                .flat_map(|m| m.into_values())
            {
                for labels in seen.series() {
                    self.family.remove(&labels);
                }
            }
            return;
        };
        let seen = self.seen.entry(uid).or_default();
        for c in &view.containers {
            if c.name.is_empty() {
                // Not named by the runtime yet: counted when it is.
                continue;
            }
            let labels = ContainerLabels {
                namespace: view.namespace.clone(),
                pod: view.name.clone(),
                container: c.name.clone(),
            };
            let entry = seen.entry(c.id).or_insert(Seen {
                labels: labels.clone(),
                counted: 0,
                scopes: Vec::new(),
            });
            if c.oom_kills <= entry.counted {
                continue;
            }
            let scope = match &c.last_oom {
                Some(o) if o.scope == OomScope::Unknown(ScopeUnknown::LogNotRead) => {
                    let waited = now.duration_since(o.time).unwrap_or_default();
                    if waited < SCOPE_GRACE {
                        // The report is on its way: counted when it comes (or the grace ends).
                        let ends = now + (SCOPE_GRACE - waited);
                        let at = self.held.entry(uid).or_insert(ends);
                        *at = (*at).min(ends);
                        continue;
                    }
                    o.scope.label()
                }
                Some(o) => o.scope.label(),
                None => OomScope::Unknown(ScopeUnknown::LogNotRead).label(),
            };
            let series = OomKillLabels {
                namespace: labels.namespace,
                pod: labels.pod,
                container: labels.container,
                scope,
            };
            self.family
                .get_or_create(&series)
                .inc_by(u64::from(c.oom_kills - entry.counted));
            entry.counted = c.oom_kills;
            if !entry.scopes.contains(&scope) {
                entry.scopes.push(scope);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::testkit::{cv, oom, t, view};
    use crate::reconcile::ContainerPhase;

    fn count(f: &Family<OomKillLabels, Counter>, scope: &'static str) -> u64 {
        f.get_or_create(&OomKillLabels {
            namespace: "default".into(),
            pod: "pod".into(),
            container: "app".into(),
            scope,
        })
        .get()
    }

    fn killed(scope: OomScope) -> PodView {
        let mut app = cv("app", 0, ContainerPhase::Running);
        let mut o = oom(&app, 42, "hog", false);
        o.time = t(10);
        o.scope = scope;
        app.last_oom = Some(o);
        app.oom_kills = 1;
        let mut v = view(vec![app]);
        v.namespace = "default".into();
        v.name = "pod".into();
        v
    }

    #[test]
    fn a_kill_is_counted_once_under_the_scope_its_report_names() {
        let family = Family::<OomKillLabels, Counter>::default();
        let mut k = KillCounter::new(family.clone());
        let uid = killed(OomScope::Pod).uid;
        // The probes saw it; the log's report is on its way: not counted yet.
        let early = killed(OomScope::Unknown(ScopeUnknown::LogNotRead));
        k.update_at(uid, Some(&early), t(10) + Duration::from_millis(20));
        assert_eq!(count(&family, "unknown"), 0);
        k.update_at(
            uid,
            Some(&killed(OomScope::Pod)),
            t(10) + Duration::from_millis(40),
        );
        assert_eq!(count(&family, "pod"), 1);
        // The same kill seen again is not counted again.
        k.update_at(uid, Some(&killed(OomScope::Pod)), t(11));
        assert_eq!(count(&family, "pod"), 1);
        assert_eq!(count(&family, "unknown"), 0);
    }

    #[test]
    fn a_report_that_never_comes_is_counted_unknown_after_the_grace() {
        let family = Family::<OomKillLabels, Counter>::default();
        let mut k = KillCounter::new(family.clone());
        let v = killed(OomScope::Unknown(ScopeUnknown::LogNotRead));
        // Seen 20 ms after the kill: held, and its owner told when to look again.
        k.update_at(v.uid, Some(&v), t(10) + Duration::from_millis(20));
        assert_eq!(count(&family, "unknown"), 0);
        assert_eq!(k.next_held(), Some(t(10) + SCOPE_GRACE));
        assert!(k.held_due(t(10) + SCOPE_GRACE / 2).is_empty());
        assert_eq!(k.held_due(t(10) + SCOPE_GRACE), vec![v.uid]);
        // Looked at again then, with no change to the view: counted.
        k.update_at(v.uid, Some(&v), t(10) + SCOPE_GRACE);
        assert_eq!(count(&family, "unknown"), 1);
        assert_eq!(k.next_held(), None);
        // The pod leaves: its series go.
        k.update_at(v.uid, None, t(20));
        let mut out = String::new();
        let mut reg = prometheus_client::registry::Registry::default();
        reg.register("oom_kills", "", family);
        prometheus_client::encoding::text::encode(&mut out, &reg).unwrap();
        assert!(!out.contains("scope="), "{out}");
    }
}
