//! The OOM kills per container (`observer_oom_kills_total`), counted where the view changes: each
//! new kill once, and a pod's series dropped when it leaves the node.
use std::collections::HashMap;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
};

use super::view::PodView;
use crate::cgroup::{ContainerId, PodUid};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ContainerLabels {
    pub namespace: String,
    pub pod: String,
    pub container: String,
}

/// The family, and the kills already counted per container.
pub(super) struct KillCounter {
    family: Family<ContainerLabels, Counter>,
    seen: HashMap<PodUid, HashMap<ContainerId, (ContainerLabels, u32)>>,
}

impl KillCounter {
    pub fn new(family: Family<ContainerLabels, Counter>) -> Self {
        Self {
            family,
            seen: HashMap::new(),
        }
    }

    /// The pod's view is now `view` (`None`: it left the node).
    pub fn update(&mut self, uid: PodUid, view: Option<&PodView>) {
        let Some(view) = view else {
            for (labels, _) in self
                .seen
                .remove(&uid)
                .into_iter()
                .flat_map(|m| m.into_values())
            {
                self.family.remove(&labels);
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
            let entry = seen.entry(c.id).or_insert((labels.clone(), 0));
            if c.oom_kills > entry.1 {
                self.family
                    .get_or_create(&labels)
                    .inc_by(u64::from(c.oom_kills - entry.1));
                entry.1 = c.oom_kills;
            }
        }
    }
}
