//! The pipeline on a task of its own, with a heartbeat, so that its failure surfaces: whoever holds
//! the [`PipelineTask`] can await [`PipelineTask::stopped`], and the agent's health check fails
//! when the reader died or stopped turning, as kubelet's PLEG health fails after 3 minutes
//! without a relist.
use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use tokio::task::JoinHandle;

use super::{counters, KernelPipeline, PipelineError, PipelineStats};
use crate::kernel::{BootClock, KernelCounters, KernelError, Probes};

/// How often the loop turns when the kernel has nothing to say: refreshes the clock and proves
/// the task alive. Cheap enough for a near-zero idle CPU.
pub const HEARTBEAT: Duration = Duration::from_secs(5);

/// What the running pipeline publishes for health checks and metrics.
pub struct PipelineHealth {
    born: Instant,
    /// Milliseconds after `born` of the loop's last turn (a batch or a heartbeat).
    last_turn_ms: AtomicU64,
    ended: AtomicBool,
    stats: Mutex<PipelineStats>,
}

impl PipelineHealth {
    fn new(stats: PipelineStats) -> Self {
        Self {
            born: Instant::now(),
            last_turn_ms: AtomicU64::new(0),
            ended: AtomicBool::new(false),
            stats: Mutex::new(stats),
        }
    }

    fn turn(&self, stats: PipelineStats) {
        self.last_turn_ms
            .store(self.born.elapsed().as_millis() as u64, Ordering::Relaxed);
        if let Ok(mut s) = self.stats.lock() {
            *s = stats;
        }
    }

    /// Time since the loop last turned.
    pub fn since_last_turn(&self) -> Duration {
        self.born.elapsed().saturating_sub(Duration::from_millis(
            self.last_turn_ms.load(Ordering::Relaxed),
        ))
    }

    /// The task ended (the reader failed, or the task panicked or was dropped).
    pub fn ended(&self) -> bool {
        self.ended.load(Ordering::Relaxed)
    }

    pub fn stats(&self) -> PipelineStats {
        self.stats.lock().map(|s| *s).unwrap_or_default()
    }
}

/// Marks the health as ended however the task stops, panics included.
struct EndOnDrop(Arc<PipelineHealth>);

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        self.0.ended.store(true, Ordering::Relaxed);
    }
}

/// A pipeline running on its own task. Dropping it stops the task (and detaches the probes once
/// nothing else holds them).
pub struct PipelineTask {
    join: Option<JoinHandle<KernelError>>,
    health: Arc<PipelineHealth>,
    probes: Arc<Mutex<Probes>>,
    clock: BootClock,
}

impl KernelPipeline {
    /// Runs the pipeline on a tokio task until the reader fails. `on_resync` is called after every
    /// walk that followed lost kernel records (the runtime should be relisted then).
    pub fn spawn(mut self, on_resync: impl Fn() + Send + 'static) -> PipelineTask {
        let health = Arc::new(PipelineHealth::new(self.stats()));
        let probes = self.probes();
        let clock = self.clock();
        let guard = EndOnDrop(Arc::clone(&health));
        let join = tokio::spawn(async move {
            let guard = guard;
            let mut tick = tokio::time::interval(HEARTBEAT);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    batch = self.next_batch(|_| {}) => match batch {
                        Ok(b) if b.resynced => on_resync(),
                        Ok(_) => {}
                        Err(e) => {
                            tracing::error!("kernel event stream failed: {e}");
                            return e;
                        }
                    },
                    _ = tick.tick() => self.reader.refresh_clock(),
                }
                guard.0.turn(self.stats());
            }
        });
        PipelineTask {
            join: Some(join),
            health,
            probes,
            clock,
        }
    }
}

impl PipelineTask {
    pub fn health(&self) -> Arc<PipelineHealth> {
        Arc::clone(&self.health)
    }

    pub fn clock(&self) -> BootClock {
        self.clock.clone()
    }

    pub fn probes(&self) -> Arc<Mutex<Probes>> {
        Arc::clone(&self.probes)
    }

    /// The kernel's own counters. A failed read is an error, never 0.
    pub fn kernel_counters(&self) -> Result<KernelCounters, KernelError> {
        counters(&self.probes)
    }

    /// Resolves when the task has stopped, with why. Pending forever once it has been returned.
    pub async fn stopped(&mut self) -> PipelineError {
        let Some(join) = self.join.as_mut() else {
            return std::future::pending().await;
        };
        let why = match join.await {
            Ok(e) => PipelineError::Kernel(e),
            Err(e) if e.is_panic() => {
                PipelineError::Panicked(crate::runner::panic_message(e.into_panic()))
            }
            Err(e) => PipelineError::Panicked(e.to_string()),
        };
        self.join = None;
        why
    }
}

impl Drop for PipelineTask {
    fn drop(&mut self) {
        if let Some(j) = &self.join {
            j.abort();
        }
    }
}
