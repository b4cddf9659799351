//! What the manager's tests share with the tests of the layers above it (the fast path's):
//! the app pod, the handles of a manager on a detached reconciler, and waiting for it.
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;

use super::StatusHandle;
use crate::{
    kube::testkit::{container, exited, pod, spec, with_memory_limit},
    model::PodUid,
    reconcile::{ContainerView, PodView, ReconcileHandle},
};

pub(crate) fn app_pod() -> Pod {
    pod(
        spec(
            "Always",
            vec![],
            vec![with_memory_limit(container("app"), "64Mi")],
        ),
        None,
    )
}

/// The manager's handle, and the reconciled view it reads (set by hand).
pub(crate) struct Handles {
    pub(crate) status: StatusHandle,
    pub(crate) reconcile: ReconcileHandle,
}

impl std::ops::Deref for Handles {
    type Target = StatusHandle;

    fn deref(&self) -> &StatusHandle {
        &self.status
    }
}

impl Handles {
    /// The reconciler's view of the pod changed.
    pub(crate) fn observe(&self, view: &PodView) {
        self.reconcile.publish(view.clone());
    }

    /// The pod left the reconciler's view.
    pub(crate) fn forget(&self, uid: &str) {
        self.reconcile.remove(PodUid::parse(uid).expect("a uid"));
    }
}

/// Lets the manager and the server work (paused time advances by itself).
pub(crate) async fn settle() {
    tokio::time::sleep(Duration::from_millis(200)).await;
}

/// A death now (after the manager started: not history).
pub(crate) fn died_now(name: &str, restart: u32, code: i32, reason: &str) -> ContainerView {
    let mut c = exited(name, restart, code, reason);
    c.finished_at = Some(SystemTime::now());
    c
}

pub(crate) fn condition<'a>(body: &'a Value, t: &str) -> Option<&'a Value> {
    body["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == t)
}
