//! What the agent shows people: kubectl's columns for a pod ([`print`]), one pod's story of its
//! deaths and kills ([`explain`]), the kernel events' lines for `observer watch` ([`render`]),
//! each pod's PodReport ([`report`]) and the kubectl plugin's reader of it ([`remote`]). It reads
//! the truth ([`crate::reconcile`]) and the status computation ([`crate::status`]); nothing below
//! it imports it.
pub mod explain;
pub mod print;
pub mod remote;
pub mod render;
pub mod report;

use crate::reconcile::PodView;

/// kubectl's STATUS column for the status the agent computes from what CRI and the kernel know
/// (without the API, so without the pod's spec): one computation for every output.
pub fn view_status(view: &PodView) -> String {
    print::view_columns(view, std::time::SystemTime::now()).status
}
