//! Log lines about one pod, under the pod's rate limit.
use super::stats::{bump, StatusStats};
use crate::{
    model::PodUid,
    ratelimit::{Admission, KeyedLimiter},
};

/// A log line about a pod, under the pod's rate limit, so that a crash-looping pod cannot flood
/// the node's log pipeline. The first line allowed after some were dropped says how many.
pub(super) fn pod_log(
    limits: &mut KeyedLimiter<PodUid>,
    stats: &StatusStats,
    uid: &PodUid,
    pod: &str,
    line: impl FnOnce(),
) {
    match limits.take(uid) {
        Admission::Allowed { denied_before } => {
            if denied_before > 0 {
                tracing::info!(
                    pod,
                    dropped = denied_before,
                    "log lines about this pod over its rate limit were dropped"
                );
            }
            line();
        }
        Admission::Denied => bump(&stats.logs_suppressed),
    }
}
