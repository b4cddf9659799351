//! The running pods the API does not list for this node (a wrong node name).
use std::{collections::HashMap, time::Duration};

use tokio::time::Instant;

use super::StatusManager;
use crate::{model::PodUid, reconcile::PodView};

/// How long a running pod may be missing from the API's pods of this node before the node name
/// is doubted: the API has a pod before its sandbox exists, so only a watch lagging can hide it.
pub(super) const UNLISTED_GRACE: Duration = Duration::from_secs(3);

/// Whether the API lists the pods the runtime runs here, and since when it does not.
#[derive(Default)]
pub(super) struct Listing {
    /// The API listed this node's pods at least once (missing before that means nothing).
    listed: bool,
    /// Pods the runtime runs that the API does not list for this node, and since when.
    unlisted: HashMap<PodUid, Instant>,
    /// Said for the pods unlisted now; said again once all were found and some go missing again.
    warned: bool,
}

impl Listing {
    /// The API's first list came.
    pub(super) fn listed(&mut self) {
        if !self.listed {
            self.listed = true;
            self.unlisted.clear();
        }
    }

    /// Whether the API lists the pod the runtime runs.
    pub(super) fn track(&mut self, uid: &PodUid, view: &PodView, listed: bool) {
        if listed || !view.sandbox_ready {
            self.forget(uid);
        } else {
            self.unlisted.entry(*uid).or_insert_with(Instant::now);
        }
    }

    pub(super) fn forget(&mut self, uid: &PodUid) {
        self.unlisted.remove(uid);
        self.warned &= !self.unlisted.is_empty();
    }

    /// When pods missing from the API's list will have been missing for the grace.
    pub(super) fn check_due(&self) -> Option<Instant> {
        if !self.listed || self.warned {
            return None;
        }
        self.unlisted
            .values()
            .min()
            .map(|since| *since + UNLISTED_GRACE)
    }

    /// The pods missing for the grace at `now`.
    fn missing(&self, now: Instant) -> impl Iterator<Item = &PodUid> {
        self.unlisted
            .iter()
            .filter(move |(_, since)| **since + UNLISTED_GRACE <= now)
            .map(|(uid, _)| uid)
    }
}

impl StatusManager {
    /// Running pods the API does not list for this node: the node name is likely wrong, and
    /// nothing is written for them.
    pub(super) fn check_node_name(&mut self) {
        let mut missing: Vec<String> = self
            .listing
            .missing(Instant::now())
            .filter_map(|uid| self.state.get(uid)?.view.as_ref())
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
        self.listing.warned = true;
    }
}
