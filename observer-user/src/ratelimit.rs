//! Per-key token buckets with bounded memory: each pod's Events and log lines, so that one
//! crash-looping pod cannot flood the API or the node's log pipeline.
use std::{collections::HashMap, hash::Hash, time::Duration};

use tokio::time::Instant;

/// A limit: `burst` at once, then one per `refill`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    pub burst: u32,
    /// Zero: no limit.
    pub refill: Duration,
}

struct Bucket {
    tokens: f64,
    at: Instant,
    /// Denied since the last allowed take.
    denied: u64,
}

/// What a take found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Go ahead; so many were denied since the last one allowed (to be said once, now).
    Allowed {
        denied_before: u64,
    },
    Denied,
}

impl Admission {
    pub fn allowed(self) -> bool {
        matches!(self, Admission::Allowed { .. })
    }
}

/// Token buckets by key, at most `max_keys` of them: past that, a full bucket (the same as
/// none) is dropped first, else the one least recently used.
pub(crate) struct KeyedLimiter<K> {
    rate: Rate,
    max_keys: usize,
    buckets: HashMap<K, Bucket>,
}

impl<K: Hash + Eq + Clone> KeyedLimiter<K> {
    pub(crate) fn new(rate: Rate, max_keys: usize) -> Self {
        Self {
            rate,
            max_keys: max_keys.max(1),
            buckets: HashMap::new(),
        }
    }

    pub(crate) fn take<Q>(&mut self, key: &Q) -> Admission
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let now = Instant::now();
        let burst = f64::from(self.rate.burst.max(1));
        if !self.buckets.contains_key(key) && self.buckets.len() >= self.max_keys {
            let victim = self
                .buckets
                .iter()
                .find(|(_, b)| self.refilled(b, now) >= burst)
                .or_else(|| self.buckets.iter().min_by_key(|(_, b)| b.at))
                .map(|(k, _)| k.clone());
            if let Some(k) = victim {
                self.buckets.remove::<K>(&k);
            }
        }
        let tokens = match self.buckets.get(key) {
            Some(b) => self.refilled(b, now).min(burst),
            None => burst,
        };
        let b = self.buckets.entry(key.to_owned()).or_insert(Bucket {
            tokens,
            at: now,
            denied: 0,
        });
        b.tokens = tokens;
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Admission::Allowed {
                denied_before: std::mem::take(&mut b.denied),
            }
        } else {
            b.denied += 1;
            Admission::Denied
        }
    }

    pub(crate) fn forget<Q>(&mut self, key: &Q)
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.buckets.remove(key);
    }

    /// Keys remembered.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.buckets.len()
    }

    fn refilled(&self, b: &Bucket, now: Instant) -> f64 {
        if self.rate.refill.is_zero() {
            return f64::INFINITY;
        }
        b.tokens + (now - b.at).as_secs_f64() / self.rate.refill.as_secs_f64()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(max_keys: usize) -> KeyedLimiter<String> {
        KeyedLimiter::new(
            Rate {
                burst: 3,
                refill: Duration::from_secs(10),
            },
            max_keys,
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_then_one_per_refill_and_the_denied_are_counted() {
        let mut l = limiter(8);
        for _ in 0..3 {
            assert_eq!(l.take("a"), Admission::Allowed { denied_before: 0 });
        }
        assert_eq!(l.take("a"), Admission::Denied);
        assert_eq!(l.take("a"), Admission::Denied);
        // Another key has its own bucket.
        assert!(l.take("b").allowed());
        tokio::time::advance(Duration::from_secs(9)).await;
        assert_eq!(l.take("a"), Admission::Denied);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(l.take("a"), Admission::Allowed { denied_before: 3 });
        assert_eq!(l.take("a"), Admission::Denied);
        // Refilled up to the burst, never past it.
        tokio::time::advance(Duration::from_secs(3600)).await;
        for _ in 0..3 {
            assert!(l.take("a").allowed());
        }
        assert_eq!(l.take("a"), Admission::Denied);
    }

    #[tokio::test(start_paused = true)]
    async fn memory_is_bounded_and_a_full_bucket_goes_first() {
        let mut l = limiter(2);
        for _ in 0..3 {
            assert!(l.take("busy").allowed());
        }
        assert!(l.take("quiet").allowed());
        tokio::time::advance(Duration::from_secs(60)).await;
        assert!(l.take("busy").allowed());
        // "quiet" has refilled completely: it is the one dropped for "new".
        assert!(l.take("new").allowed());
        assert_eq!(l.len(), 2);
        assert!(l.take("busy").allowed());
        assert!(l.take("busy").allowed());
        assert_eq!(
            l.take("busy"),
            Admission::Denied,
            "busy kept its bucket over the bound"
        );
        l.forget("busy");
        assert!(l.take("busy").allowed(), "forgotten: a fresh bucket");
    }

    #[tokio::test(start_paused = true)]
    async fn zero_refill_is_no_limit() {
        let mut l = KeyedLimiter::<String>::new(
            Rate {
                burst: 1,
                refill: Duration::ZERO,
            },
            4,
        );
        for _ in 0..100 {
            assert!(l.take("a").allowed());
        }
    }
}
