//! Bounded exponential back-off with jitter: the runtime connection's reconnects and the
//! [`super::Runner`]'s retries.
use std::time::Duration;

/// Delays double from `initial` up to `max`; each delay is drawn from [d/2, d] ("equal jitter")
/// so that agents on many nodes, or many callers, do not retry in lockstep after a runtime restart.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    pub initial: Duration,
    pub max: Duration,
    attempt: u32,
    rng: fastrand::Rng,
}

impl Backoff {
    pub(crate) fn new(initial: Duration, max: Duration) -> Self {
        Backoff {
            initial,
            max: max.max(initial),
            attempt: 0,
            rng: fastrand::Rng::new(),
        }
    }

    /// Same as [`Backoff::new`] with a fixed random seed, for reproducible tests.
    pub(crate) fn with_seed(initial: Duration, max: Duration, seed: u64) -> Self {
        Backoff {
            rng: fastrand::Rng::with_seed(seed),
            ..Backoff::new(initial, max)
        }
    }

    /// The ceiling of the next delay, before jitter.
    pub(crate) fn ceiling(&self) -> Duration {
        // 2^attempt saturates long before u32 overflows; cap the shift to stay in range.
        let factor = 1u32 << self.attempt.min(20);
        self.initial.saturating_mul(factor).min(self.max)
    }

    pub(crate) fn next_delay(&mut self) -> Duration {
        let ceiling = self.ceiling();
        self.attempt = self.attempt.saturating_add(1);
        let half = ceiling / 2;
        let span = (ceiling - half).as_nanos() as u64;
        half + Duration::from_nanos(self.rng.u64(0..=span))
    }

    /// Starts over after a success.
    pub(crate) fn reset(&mut self) {
        self.attempt = 0;
    }

    /// Delays drawn since the last reset.
    pub(crate) fn attempts(&self) -> u32 {
        self.attempt
    }
}

impl Default for Backoff {
    /// 100 ms doubling to 10 s.
    fn default() -> Self {
        Backoff::new(Duration::from_millis(100), Duration::from_secs(10))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_within_jitter_bounds_and_caps() {
        let mut b = Backoff::with_seed(Duration::from_millis(100), Duration::from_secs(10), 7);
        let mut ceiling = Duration::from_millis(100);
        for _ in 0..20 {
            let d = b.next_delay();
            assert!(
                d >= ceiling / 2 && d <= ceiling,
                "{d:?} outside [{:?}, {ceiling:?}]",
                ceiling / 2
            );
            ceiling = (ceiling * 2).min(Duration::from_secs(10));
        }
        assert_eq!(b.ceiling(), Duration::from_secs(10));
    }

    #[test]
    fn reset_starts_over() {
        let mut b = Backoff::with_seed(Duration::from_millis(100), Duration::from_secs(10), 1);
        for _ in 0..5 {
            b.next_delay();
        }
        assert_eq!(b.attempts(), 5);
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(100));
    }

    #[test]
    fn jitter_spreads_delays() {
        let mut b = Backoff::with_seed(Duration::from_secs(1), Duration::from_secs(1), 3);
        let delays: std::collections::HashSet<_> = (0..10).map(|_| b.next_delay()).collect();
        assert!(delays.len() > 5, "jitter produced {delays:?}");
    }

    #[test]
    fn survives_many_attempts() {
        let mut b = Backoff::default();
        for _ in 0..1000 {
            assert!(b.next_delay() <= Duration::from_secs(10));
        }
    }
}
