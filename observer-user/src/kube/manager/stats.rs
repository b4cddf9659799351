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
    /// Events handed to the publisher (it counts what it published, dropped and failed).
    pub events: AtomicU64,
    /// Audit findings by [`FindingKind`] (index [`FindingKind::index`]).
    pub audit_findings: [AtomicU64; 4],
    /// Pod watch errors (the API unreachable).
    pub watch_errors: AtomicU64,
    /// Log lines about a pod dropped over its rate limit.
    pub logs_suppressed: AtomicU64,
}

impl StatusStats {
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}

pub(super) fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}
