//! From the reconciled view to the status manager and the per-container OOM metric: every pod
//! whose view changed is handed over once per burst of changes.
use std::collections::HashMap;

use prometheus_client::metrics::{counter::Counter, family::Family};

use super::metrics::ContainerLabels;
use crate::{
    cgroup::{ContainerId, PodUid},
    kube::StatusHandle,
    reconcile::{PodView, ReconcileHandle},
};

/// What the feed remembers of a pod: its containers' OOM kill counts, to count new kills once.
#[derive(Default)]
struct Seen {
    labels: HashMap<ContainerId, (ContainerLabels, u32)>,
}

/// Runs until the reconciler is gone.
pub async fn run(
    reconcile: ReconcileHandle,
    status: Option<StatusHandle>,
    oom_kills: Family<ContainerLabels, Counter>,
) {
    let mut seen: HashMap<PodUid, Seen> = HashMap::new();
    loop {
        for uid in reconcile.changed_pods().await {
            match reconcile.pod(&uid) {
                Some(view) => {
                    count_kills(seen.entry(uid).or_default(), &view, &oom_kills);
                    if let Some(s) = &status {
                        s.observe(&view);
                    }
                }
                None => {
                    // Gone from the node: its metric series and the manager's state go too.
                    if let Some(old) = seen.remove(&uid) {
                        for (labels, _) in old.labels.values() {
                            oom_kills.remove(labels);
                        }
                    }
                    if let Some(s) = &status {
                        s.forget(uid.as_str());
                    }
                }
            }
        }
    }
}

fn count_kills(seen: &mut Seen, view: &PodView, family: &Family<ContainerLabels, Counter>) {
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
        let entry = seen.labels.entry(c.id).or_insert((labels.clone(), 0));
        if c.oom_kills > entry.1 {
            family
                .get_or_create(&labels)
                .inc_by(u64::from(c.oom_kills - entry.1));
            entry.1 = c.oom_kills;
        }
    }
}
