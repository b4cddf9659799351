//! The running pods the API does not list for this node (a wrong node name).
use std::time::Duration;

use tokio::time::Instant;

use super::StatusManager;
use crate::{model::PodUid, reconcile::PodView};

/// How long a running pod may be missing from the API's pods of this node before the node name
/// is doubted: the API has a pod before its sandbox exists, so only a watch lagging can hide it.
pub(super) const UNLISTED_GRACE: Duration = Duration::from_secs(3);

impl StatusManager {
    /// When pods missing from the API's list will have been missing for the grace.
    pub(super) fn node_check_due(&self) -> Option<Instant> {
        if !self.listed || self.node_warned {
            return None;
        }
        self.unlisted
            .values()
            .min()
            .map(|since| *since + UNLISTED_GRACE)
    }

    /// Running pods the API does not list for this node: the node name is likely wrong, and
    /// nothing is written for them.
    pub(super) fn check_node_name(&mut self) {
        let now = Instant::now();
        let mut missing: Vec<String> = self
            .unlisted
            .iter()
            .filter(|(_, since)| **since + UNLISTED_GRACE <= now)
            .filter_map(|(uid, _)| self.state.get(uid)?.view.as_ref())
            .map(|v| format!("{}/{}", v.namespace, v.name))
            .collect();
        if missing.is_empty() {
            return;
        }
        missing.sort();
        let n = missing.len();
        missing.truncate(3);
        tracing::warn!(
            "{n} pod(s) the runtime runs here are not among the API's pods of node {:?} ({}{}): is --node-name (NODE_NAME) this node's name as the API knows it (kubectl get nodes)? Nothing is written for them",
            self.cfg.node_name,
            missing.join(", "),
            if n > 3 { ", ..." } else { "" },
        );
        self.node_warned = true;
    }

    /// Whether the API lists the pod the runtime runs.
    pub(super) fn track_listing(&mut self, uid: &PodUid, view: &PodView, listed: bool) {
        if listed || !view.sandbox_ready {
            self.unlisted.remove(uid);
            self.node_warned &= !self.unlisted.is_empty();
        } else {
            self.unlisted.entry(*uid).or_insert_with(Instant::now);
        }
    }
}
