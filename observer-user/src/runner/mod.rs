//! A per-key job runner, in the spirit of kube-runtime's controller runner. Work is keyed (a pod):
//!
//! - the latest state of a key wins: states scheduled while a job for the key runs or waits are
//!   folded into one, the newest;
//! - at most one job per key is in flight; jobs of different keys run concurrently, up to a bound;
//!   when more are ready than the bound takes, the higher [`Priority`] starts first (in the order
//!   they became ready within one), so a burst of routine work never holds back what matters;
//! - a failed job is retried with the newest state after the key's jittered exponential back-off
//!   (or the delay the other side asked for); a new state does not bring a retry forward, so a
//!   failing peer is not hammered by a busy key;
//! - a job that panics is counted, reported and retried like a failure: never lost, and its key is
//!   never left "in flight".
//!
//! The owner drives it from its own loop: [`Runner::schedule`] when a key's state changes, and
//! `runner.next().await` (cancel-safe, made for `select!`) to learn what finished.
mod backoff;

use std::{
    collections::{HashMap, VecDeque},
    future::Future,
    hash::Hash,
    pin::Pin,
    sync::Arc,
    time::Duration,
};

pub(crate) use backoff::Backoff;
use tokio::task::{Id, JoinError, JoinSet};
use tokio_util::time::{delay_queue, DelayQueue};

/// Which ready keys start first once the concurrency bound is reached. A key keeps the highest
/// priority of the states folded into it, and its retries keep it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum Priority {
    /// Ahead of everything (a gated pod's first death).
    High = 0,
    /// Ahead of routine work (another pod's first death).
    Raised = 1,
    #[default]
    Normal = 2,
}

const PRIORITIES: usize = 3;

/// What a job returns: its output and what the runner does next for the key.
pub struct Step<R> {
    pub output: R,
    pub then: Then,
}

impl<R> Step<R> {
    pub fn done(output: R) -> Self {
        Self {
            output,
            then: Then::Done,
        }
    }

    pub fn retry(output: R) -> Self {
        Self {
            output,
            then: Then::Retry,
        }
    }
}

/// What to do with a key once its job finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Then {
    /// Succeeded: the back-off resets; a state that arrived meanwhile runs now.
    Done,
    /// Failed: run again, with the newest state, after the key's next back-off delay.
    Retry,
    /// Failed, and the other side said when to come back (HTTP 429 `Retry-After`): at least
    /// that long, and never sooner than the back-off.
    RetryAfter(Duration),
    /// Nothing more to do for the key (its object is gone): a pending state is dropped too.
    Forget,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("job panicked: {0}")]
pub(crate) struct JobPanicked(pub String);

/// A job that finished.
#[derive(Debug)]
pub(crate) struct Finished<K, R> {
    pub key: K,
    /// `Err` when the job panicked; it is then retried like a failure.
    pub output: Result<R, JobPanicked>,
    /// Consecutive failures of the key, this one included (0 after a success).
    pub failures: u32,
}

#[derive(Clone, Debug)]
pub(crate) struct RunnerConfig {
    /// Jobs in flight at once, over all keys.
    pub max_concurrent: usize,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// Seed of the back-off jitter, for reproducible tests; `None`: random.
    pub seed: Option<u64>,
}

impl Default for RunnerConfig {
    fn default() -> Self {
        Self {
            max_concurrent: 16,
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(10),
            seed: None,
        }
    }
}

/// Counters since the runner was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RunnerStats {
    pub started: u64,
    pub retries: u64,
    pub panics: u64,
    /// States replaced by a newer one before a job took them.
    pub superseded: u64,
}

type Job<K, V, R> =
    Arc<dyn Fn(K, V) -> Pin<Box<dyn Future<Output = Step<R>> + Send>> + Send + Sync>;

struct Slot<V> {
    /// The newest state no job has taken yet.
    pending: Option<V>,
    /// The state the running job took, kept so that a failure retries it when nothing newer came.
    running: Option<V>,
    /// The highest priority of the pending states, and of the running one.
    priority: Priority,
    running_priority: Priority,
    in_flight: bool,
    queued: bool,
    delayed: Option<delay_queue::Key>,
    /// Forgotten while its job ran: removed when the job finishes.
    forget: bool,
    backoff: Backoff,
    failures: u32,
}

pub(crate) struct Runner<K, V, R> {
    job: Job<K, V, R>,
    cfg: RunnerConfig,
    slots: HashMap<K, Slot<V>>,
    /// Keys ready to start, by priority. A key raised while queued is queued again higher up; its
    /// older entry is skipped when reached (`Slot::queued` is false by then).
    ready: [VecDeque<K>; PRIORITIES],
    delays: DelayQueue<K>,
    running: JoinSet<Step<R>>,
    tasks: HashMap<Id, K>,
    seeds: u64,
    stats: RunnerStats,
}

impl<K, V, R> Runner<K, V, R>
where
    K: Clone + Eq + Hash + Send + 'static,
    V: Clone + Send + 'static,
    R: Send + 'static,
{
    /// `job(key, state)` is spawned on the current tokio runtime for each run.
    pub(crate) fn new<F, Fut>(cfg: RunnerConfig, job: F) -> Self
    where
        F: Fn(K, V) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Step<R>> + Send + 'static,
    {
        Self {
            job: Arc::new(move |k, v| Box::pin(job(k, v))),
            cfg: RunnerConfig {
                max_concurrent: cfg.max_concurrent.max(1),
                ..cfg
            },
            slots: HashMap::new(),
            ready: Default::default(),
            delays: DelayQueue::new(),
            running: JoinSet::new(),
            tasks: HashMap::new(),
            seeds: 0,
            stats: RunnerStats::default(),
        }
    }

    /// Sets the key's newest state. It runs as soon as the key has no job in flight, is not
    /// waiting out a back-off, and a concurrency slot is free.
    pub(crate) fn schedule(&mut self, key: K, state: V) {
        self.schedule_after(key, state, None, Priority::Normal);
    }

    /// [`Self::schedule`] at `priority`.
    pub(crate) fn schedule_at(&mut self, key: K, state: V, priority: Priority) {
        self.schedule_after(key, state, None, priority);
    }

    /// [`Self::schedule`], but not before `delay` (a requeue: "ask again shortly"). A key that is
    /// already busy keeps its own timing.
    pub(crate) fn schedule_in(&mut self, key: K, state: V, delay: Duration) {
        self.schedule_after(key, state, Some(delay), Priority::Normal);
    }

    fn schedule_after(&mut self, key: K, state: V, delay: Option<Duration>, priority: Priority) {
        let backoff = self.new_backoff();
        let slot = self.slots.entry(key.clone()).or_insert_with(|| Slot {
            pending: None,
            running: None,
            priority,
            running_priority: Priority::Normal,
            in_flight: false,
            queued: false,
            delayed: None,
            forget: false,
            backoff,
            failures: 0,
        });
        if slot.pending.replace(state).is_some() {
            self.stats.superseded += 1;
            let raised = priority < slot.priority;
            slot.priority = slot.priority.min(priority);
            if raised && slot.queued {
                self.ready[priority as usize].push_back(key.clone());
            }
        } else {
            slot.priority = priority;
        }
        slot.forget = false;
        if !slot.in_flight && !slot.queued && slot.delayed.is_none() {
            match delay {
                Some(d) => slot.delayed = Some(self.delays.insert(key, d)),
                None => {
                    slot.queued = true;
                    self.ready[slot.priority as usize].push_back(key);
                }
            }
        }
        self.start_ready();
    }

    /// Drops the key's pending state and back-off. A job in flight still finishes (and is
    /// reported), but is not retried.
    pub(crate) fn forget(&mut self, key: &K) {
        let Some(slot) = self.slots.get_mut(key) else {
            return;
        };
        if let Some(d) = slot.delayed.take() {
            self.delays.remove(&d);
        }
        slot.pending = None;
        if slot.in_flight {
            slot.forget = true;
        } else {
            self.slots.remove(key);
        }
    }

    /// Ends every back-off now: keys waiting to retry run as soon as a slot is free (a flush at
    /// shutdown).
    pub(crate) fn expedite(&mut self) {
        for slot in self.slots.values_mut() {
            slot.delayed = None;
        }
        self.delays.clear();
        let keys: Vec<K> = self
            .slots
            .iter()
            .filter(|(_, s)| !s.in_flight && !s.queued && s.pending.is_some())
            .map(|(k, _)| k.clone())
            .collect();
        for k in keys {
            if let Some(s) = self.slots.get_mut(&k) {
                s.queued = true;
                self.ready[s.priority as usize].push_back(k);
            }
        }
        self.start_ready();
    }

    /// The next job to finish. Pending forever while nothing runs or waits. Cancel-safe.
    pub(crate) async fn next(&mut self) -> Finished<K, R> {
        loop {
            self.start_ready();
            tokio::select! {
                Some(done) = self.running.join_next_with_id(), if !self.running.is_empty() => {
                    return self.finish(done);
                }
                Some(expired) = std::future::poll_fn(|cx| self.delays.poll_expired(cx)),
                    if !self.delays.is_empty() =>
                {
                    let key = expired.into_inner();
                    if let Some(slot) = self.slots.get_mut(&key) {
                        slot.delayed = None;
                        if slot.pending.is_some() && !slot.in_flight && !slot.queued {
                            slot.queued = true;
                            self.ready[slot.priority as usize].push_back(key);
                        }
                    }
                }
                else => std::future::pending::<()>().await,
            }
        }
    }

    /// Nothing pending, running or waiting to retry.
    pub(crate) fn is_idle(&self) -> bool {
        self.slots.is_empty()
    }

    /// Whether the key has work pending, in flight or waiting to retry.
    pub(crate) fn is_busy(&self, key: &K) -> bool {
        self.slots.contains_key(key)
    }

    #[cfg(test)]
    pub(crate) fn in_flight(&self) -> usize {
        self.running.len()
    }

    /// Jobs running or ready to run now (not waiting out a delay).
    #[cfg(test)]
    pub(crate) fn active(&self) -> usize {
        self.running.len() + self.slots.values().filter(|s| s.queued).count()
    }

    /// Keys with work pending, in flight or waiting to retry.
    pub(crate) fn keys(&self) -> usize {
        self.slots.len()
    }

    #[cfg(test)]
    pub(crate) fn stats(&self) -> RunnerStats {
        self.stats
    }

    fn new_backoff(&mut self) -> Backoff {
        let (initial, max) = (self.cfg.backoff_initial, self.cfg.backoff_max);
        match self.cfg.seed {
            Some(seed) => {
                self.seeds += 1;
                Backoff::with_seed(initial, max, seed.wrapping_add(self.seeds))
            }
            None => Backoff::new(initial, max),
        }
    }

    fn start_ready(&mut self) {
        while self.running.len() < self.cfg.max_concurrent {
            let Some(key) = self.ready.iter_mut().find_map(VecDeque::pop_front) else {
                return;
            };
            let Some(slot) = self.slots.get_mut(&key) else {
                continue;
            };
            // An entry left behind when the key was raised, or the key started already.
            if !slot.queued || slot.in_flight {
                continue;
            }
            slot.queued = false;
            let Some(state) = slot.pending.take() else {
                continue;
            };
            slot.running = Some(state.clone());
            slot.running_priority = std::mem::take(&mut slot.priority);
            slot.in_flight = true;
            self.stats.started += 1;
            let handle = self.running.spawn((self.job)(key.clone(), state));
            self.tasks.insert(handle.id(), key);
        }
    }

    fn finish(&mut self, done: Result<(Id, Step<R>), JoinError>) -> Finished<K, R> {
        let (id, result) = match done {
            Ok((id, step)) => (id, Ok(step)),
            Err(e) => (e.id(), Err(e)),
        };
        let key = self
            .tasks
            .remove(&id)
            .expect("every spawned job's key is recorded");
        let (output, then) = match result {
            Ok(step) => (Ok(step.output), step.then),
            Err(e) => {
                self.stats.panics += 1;
                let why = if e.is_panic() {
                    panic_message(e.into_panic())
                } else {
                    e.to_string()
                };
                (Err(JobPanicked(why)), Then::Retry)
            }
        };
        let slot = self
            .slots
            .get_mut(&key)
            .expect("a key in flight keeps its slot");
        slot.in_flight = false;
        let ran = slot.running.take();
        let forget = std::mem::take(&mut slot.forget);
        let failures = if forget || then == Then::Forget {
            let f = slot.failures;
            self.slots.remove(&key);
            f
        } else if then == Then::Done {
            slot.failures = 0;
            slot.backoff.reset();
            if slot.pending.is_some() {
                slot.queued = true;
                self.ready[slot.priority as usize].push_back(key.clone());
            } else {
                self.slots.remove(&key);
            }
            0
        } else {
            self.stats.retries += 1;
            slot.failures += 1;
            if slot.pending.is_none() {
                slot.pending = ran;
                slot.priority = slot.running_priority;
            } else {
                slot.priority = slot.priority.min(slot.running_priority);
            }
            let mut delay = slot.backoff.next_delay();
            if let Then::RetryAfter(asked) = then {
                delay = delay.max(asked);
            }
            slot.delayed = Some(self.delays.insert(key.clone(), delay));
            slot.failures
        };
        self.start_ready();
        Finished {
            key,
            output,
            failures,
        }
    }
}

pub(crate) fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".into())
}

#[cfg(test)]
mod tests;
