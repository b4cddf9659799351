//! The manager's counters, read at scrape time.
use std::sync::atomic::{AtomicU64, Ordering};

/// Counters for metrics, readable while the manager runs.
#[derive(Debug, Default)]
pub struct StatusStats {
    /// Changed views taken from the reconciler.
    pub observed: AtomicU64,
    /// Pod statuses (or condition sets) computed.
    pub computed: AtomicU64,
    /// Patches handed to the writer.
    pub submitted: AtomicU64,
    /// Patches the API accepted.
    pub writes: AtomicU64,
    /// Computations that needed no write (equal to the last sent, or to the API's).
    pub unchanged: AtomicU64,
    /// Failed attempts (5xx, timeouts, transport); each is retried.
    pub write_errors: AtomicU64,
    /// 429s (retried after the server's Retry-After); not in `write_errors`.
    pub throttled: AtomicU64,
    /// 404: the pod was gone.
    pub gone: AtomicU64,
    /// 409: the UID precondition failed (a re-created pod).
    pub conflicts: AtomicU64,
    /// 400/422: the server refused the patch.
    pub rejected: AtomicU64,
    /// Computations put off because the reflector did not have the pod yet.
    pub waiting_for_pod: AtomicU64,
    /// Computations put off because the fast path wrote a death the view did not show yet.
    pub fast_waits: AtomicU64,
    /// Events handed to the publisher (it counts what it published, dropped and failed).
    pub events: AtomicU64,
    /// Audit findings by [`crate::status::audit::FindingKind`] (index `FindingKind::index`).
    pub audit_findings: [AtomicU64; 4],
    /// Pod watch errors (the API unreachable).
    pub watch_errors: AtomicU64,
    /// Log lines about a pod dropped over its rate limit.
    pub logs_suppressed: AtomicU64,
    /// From the reconciled view's change to its patch leaving the process.
    pub write_latency: crate::exposition::Latency,
}

impl StatusStats {
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}

pub(super) fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl super::StatusHandle {
    /// The status manager's and its Events' metrics.
    pub(crate) fn encode_metrics(
        &self,
        e: &mut prometheus_client::encoding::DescriptorEncoder<'_>,
    ) -> std::fmt::Result {
        use super::super::audit::FindingKind;
        use crate::exposition::{counter, counters};
        let s = self.stats();
        let g = StatusStats::get;
        counter(
            e,
            "status_writes",
            "Pod status patches the API accepted",
            g(&s.writes),
        )?;
        counter(
            e,
            "status_write_errors",
            "Failed status patches (5xx, timeouts, transport; each retried)",
            g(&s.write_errors),
        )?;
        counter(
            e,
            "status_write_retries",
            "Status patches retried (errors and 429s)",
            g(&s.write_errors) + g(&s.throttled),
        )?;
        counter(
            e,
            "status_throttled",
            "Status patches the API throttled (429)",
            g(&s.throttled),
        )?;
        counter(
            e,
            "status_conflicts",
            "Status patches refused by the UID precondition (a re-created pod)",
            g(&s.conflicts),
        )?;
        counter(
            e,
            "status_gone",
            "Status patches for pods the API no longer has",
            g(&s.gone),
        )?;
        counter(
            e,
            "status_rejected",
            "Status patches the API refused as invalid",
            g(&s.rejected),
        )?;
        counter(
            e,
            "status_unchanged",
            "Computed statuses that needed no write",
            g(&s.unchanged),
        )?;
        counter(
            e,
            "status_fast_path_waits",
            "Status computations put off until the agent's view showed a death the fast path wrote",
            g(&s.fast_waits),
        )?;
        counter(
            e,
            "api_watch_errors",
            "Errors of the watch on this node's pods",
            g(&s.watch_errors),
        )?;
        counter(
            e,
            "pod_log_lines_dropped",
            "Log lines about a pod dropped over its per-pod rate limit",
            g(&s.logs_suppressed),
        )?;
        counters(
            e,
            "audit_findings",
            "Disagreements between kubelet's status in the API and the kernel's account",
            "reason",
            FindingKind::ALL
                .iter()
                .map(|k| (k.reason(), g(&s.audit_findings[k.index()]))),
        )?;
        let ev = self.event_stats();
        let [queued, published, failed, retried, limited, overflow, _pending] = ev.snapshot();
        counter(e, "events_queued", "Kubernetes Events queued", queued)?;
        counter(
            e,
            "events_published",
            "Kubernetes Events published",
            published,
        )?;
        counter(
            e,
            "events_failed",
            "Kubernetes Events the API refused, or never took within their max age",
            failed,
        )?;
        counter(
            e,
            "events_retried",
            "Kubernetes Events sent again after the API was away, overloaded or throttling",
            retried,
        )?;
        counter(
            e,
            "events_rate_limited",
            "Kubernetes Events over a pod's rate limit",
            limited,
        )?;
        counter(
            e,
            "events_overflow",
            "Kubernetes Events dropped because the queue was full",
            overflow,
        )?;
        counter(
            e,
            "events_already_told",
            "Deaths to be told late that an earlier agent's Event had told already (not told again)",
            ev.already_told.load(std::sync::atomic::Ordering::Relaxed),
        )?;
        counter(
            e,
            "events_unknown_not_told",
            "Deaths an earlier agent wrote False for whose Event could not be looked for (the API away, the list refused): not told, as most likely told",
            ev.unknown_not_told.load(std::sync::atomic::Ordering::Relaxed),
        )?;
        counter(
            e,
            "events_landed_unanswered",
            "Event creates whose answer never came (a timeout, a 5xx) found created before being sent again: not created twice",
            ev.landed_unanswered.load(std::sync::atomic::Ordering::Relaxed),
        )?;
        s.write_latency.encode(
            e,
            "status_write_latency",
            "Time from a change of the agent's view of a pod to its status patch leaving the process",
        )
    }
}
